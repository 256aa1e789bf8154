#!/bin/bash
# Build the lab guest kernel (Linux 6.12 from Debian's linux-source-6.12, Rust
# enabled, Xen PV dom0 + domU) into a cache directory. Idempotent: an
# interrupted build resumes (make is incremental); a finished one is marked
# with .complete and left alone. The built tree is kept, because out-of-tree
# Rust modules need rust/*.rmeta, Module.symvers and scripts/target.json.
#
#   lab/kernel/build.sh OUTDIR      (normally called by lab/run)
#
# LAB_KERNEL (lib/common.sh, kernel_fragments) chooses the fragments:
# xensock-lab.config, and for LAB_KERNEL=debug xensock-debug.config after it.
set -euo pipefail
{ # parsed whole before it runs: editing this file mid-build is safe
# Part of the cache key: bump when a change here changes the built kernel.
RECIPE_VERSION=1
LAB_DIR=$(cd "$(dirname "$0")/.." && pwd)
. "$LAB_DIR/lib/common.sh"
OUT=${1:?usage: build.sh OUTDIR}
mapfile -t FRAGS < <(kernel_fragments)
mapfile -t KV < <(kmake_vars)
JOBS=${LAB_JOBS:-$(nproc)}

[[ -f $OUT/.complete ]] && { echo "kernel already built in $OUT"; exit 0; }
[[ -r $KSRC_TARBALL ]] || { echo "missing $KSRC_TARBALL (apt-get install linux-source-6.12)" >&2; exit 1; }
mkdir -p "$OUT"
# the fragments in order, as one file: a later line wins over an earlier one
FRAG=$OUT/fragment.config
cat "${FRAGS[@]}" > "$FRAG"
exec 8> "$OUT/.build-lock"
flock -n 8 || { echo "another build of $OUT is running" >&2; exit 1; }
K=$OUT/linux
if [[ ! -f $K/Makefile ]]; then
  echo "extracting $KSRC_TARBALL"
  rm -rf "$OUT/linux-source-6.12" "$K"
  tar -C "$OUT" -xf "$KSRC_TARBALL"
  # our fixes to the source (lab/kernel/patches, part of the cache key)
  for p in "$LAB_DIR"/kernel/patches/*.patch; do
    [[ -f $p ]] || continue
    echo "applying $(basename "$p")"
    patch -d "$OUT/linux-source-6.12" -p1 --forward --quiet < "$p"
  done
  mv "$OUT/linux-source-6.12" "$K"
fi
cd "$K"
make -s "${KV[@]}" rustavailable

# --- configuration: tinyconfig + fragment, iterated because some options only
# become visible once their dependencies are on; then every line is verified.
apply_fragment() {
  local line opt val
  while IFS= read -r line; do
    if [[ $line =~ ^(CONFIG_[A-Za-z0-9_]+)=(.*)$ ]]; then
      opt=${BASH_REMATCH[1]#CONFIG_}; val=${BASH_REMATCH[2]}
      case $val in y) scripts/config -e "$opt";; m) scripts/config -m "$opt";;
                   *) scripts/config --set-val "$opt" "$val";; esac
    elif [[ $line =~ ^#\ (CONFIG_[A-Za-z0-9_]+)\ is\ not\ set$ ]]; then
      scripts/config -d "${BASH_REMATCH[1]#CONFIG_}"
    fi
  done < "$FRAG"
}
check_fragment() {
  local line bad=0 opt want have
  while IFS= read -r line; do
    if [[ $line =~ ^(CONFIG_[A-Za-z0-9_]+)=(.*)$ ]]; then
      opt=${BASH_REMATCH[1]}; want=${BASH_REMATCH[2]}
      have=$(grep -E "^$opt=" .config | cut -d= -f2- || true)
      [[ $have == "$want" ]] || { echo "  $opt: want $want, got ${have:-unset}"; bad=1; }
    elif [[ $line =~ ^#\ (CONFIG_[A-Za-z0-9_]+)\ is\ not\ set$ ]]; then
      opt=${BASH_REMATCH[1]}
      ! grep -qE "^$opt=[ym]" .config || { echo "  $opt: want off, is on"; bad=1; }
    fi
  done < "$FRAG"
  return $bad
}
if [[ ! -f .config ]] || ! cmp -s "$FRAG" .xensock-lab-fragment; then
  make -s "${KV[@]}" tinyconfig
  for pass in 1 2 3; do
    apply_fragment
    make -s "${KV[@]}" olddefconfig
    if check_fragment >/dev/null; then break; fi
  done
  if ! check_fragment; then echo "kernel config: fragment options not satisfied (see above)" >&2; exit 1; fi
  cp "$FRAG" .xensock-lab-fragment
  echo "config ok ($(grep -c '=[ym]' .config) options on)"
fi

# --- build
echo "make -j$JOBS bzImage modules ($(date -u +%T))"
# A cold -j2 build once failed right after "bzImage is ready" with a bare
# "ld: no input files" (GNU ld, so from a tools/ sub-make, not the kernel's
# ld.lld) and succeeded when make was simply run again: retry once.
if ! make "${KV[@]}" -j"$JOBS" bzImage modules; then
  echo "make failed; retrying once (incremental)"
  make "${KV[@]}" -j"$JOBS" bzImage modules
fi
cp arch/x86/boot/bzImage "$OUT/bzImage"
# modules built in-tree (the Rust sample), installed into a staging dir
rm -rf "$OUT/modules"
make -s "${KV[@]}" INSTALL_MOD_PATH="$OUT/modules" INSTALL_MOD_STRIP=1 modules_install
make -s "${KV[@]}" kernelrelease > "$OUT/kernelrelease"
toolchain_id > "$OUT/toolchain"
date -u +%FT%TZ > "$OUT/.complete"
echo "kernel built: $OUT/bzImage ($(cat "$OUT/kernelrelease"))"
exit 0
}
