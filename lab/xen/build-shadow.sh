#!/bin/bash
# Rebuild just the Xen hypervisor from Debian's own xen source package with
# CONFIG_SHADOW_PAGING=y. Debian ships Xen without shadow paging, and PV
# guests need it for log-dirty mode, i.e. for `xl migrate` (live migration);
# without it `xl migrate` fails with "Failed to enable logdirty".
# Same version and same config as the Debian binary otherwise.
#
#   lab/xen/build-shadow.sh OUTDIR    (normally called by lab/run --xen shadow)
# Writes OUTDIR/xen (multiboot ELF for QEMU) and OUTDIR/.complete.
set -euo pipefail
{ # parsed whole before it runs: editing this file mid-build is safe
# Part of the cache key: bump when a change here changes the built image.
RECIPE_VERSION=1
LAB_DIR=$(cd "$(dirname "$0")/.." && pwd)
. "$LAB_DIR/lib/common.sh"
OUT=${1:?usage: build-shadow.sh OUTDIR}
DEBCONFIG=${2:?usage: build-shadow.sh OUTDIR DEBIAN_CONFIG}
VER=${3:?usage: build-shadow.sh OUTDIR DEBIAN_CONFIG VERSION}
[[ -f $OUT/.complete ]] && { echo "already built: $OUT/xen"; exit 0; }
mkdir -p "$OUT"
exec 8> "$OUT/.build-lock"
flock -n 8 || { echo "another build of $OUT is running" >&2; exit 1; }
cd "$OUT"
if [[ ! -d src ]]; then
  chmod 755 "$OUT"
  # Needs deb-src lines (lab/lib/deps.sh adds them). The mirror reachable
  # here serves bookworm's sources but 404s on bookworm-security's, so when
  # the exact version cannot be fetched, take the newest 4.17 source that
  # can: same stable series, same domctl/sysctl interface as the tools.
  got=
  for v in "$VER" $(apt-cache showsrc xen | awk '/^Version: 4\.17/ {print $2}' | sort -rV); do
    rm -f xen_*
    if timeout 600 apt-get source -q --download-only "xen=$v" > apt-source.log 2>&1; then got=$v; break; fi
    echo "source of xen $v not downloadable; trying an older one"
  done
  [[ -n $got ]] || { cat apt-source.log; echo "no xen 4.17 source package downloadable" >&2; exit 1; }
  [[ $got = "$VER" ]] || echo "WARNING: building hypervisor $got (tools are $VER)"
  echo "$got" > "$OUT/version"
  dpkg-source -x xen_*.dsc src.tmp > /dev/null
  mv src.tmp src
fi
cd src/xen
cp "$DEBCONFIG" .config
sed -i 's/^# CONFIG_SHADOW_PAGING is not set$/CONFIG_SHADOW_PAGING=y/' .config
grep -q '^CONFIG_SHADOW_PAGING=y' .config || echo 'CONFIG_SHADOW_PAGING=y' >> .config
make -s olddefconfig
grep -q '^CONFIG_SHADOW_PAGING=y' .config || { echo "CONFIG_SHADOW_PAGING did not stick" >&2; exit 1; }
make -j"$(nproc)" XEN_TARGET_ARCH=x86_64 >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
cp xen "$OUT/xen"
date -u +%FT%TZ > "$OUT/.complete"
echo "built: $OUT/xen (xen $(cat "$OUT/version") + CONFIG_SHADOW_PAGING=y)"
exit 0
}
