# shellcheck shell=bash
# Shared helpers for lab/run and lab/kbuild-env. Sourced, never executed.

LAB_DIR=${LAB_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
REPO_DIR=$(cd "$LAB_DIR/.." && pwd)
CACHE=${XENSOCK_LAB_CACHE:-/var/cache/xensock-lab}
XENV=4.17
XEN_BIN=/usr/lib/xen-$XENV/bin
KSRC_TARBALL=/usr/src/linux-source-6.12.tar.xz
RUSTC=/usr/bin/rustc
RUST_LIB_SRC=/usr/lib/rustlib/src/rust/library
BINDGEN=$CACHE/tools/bin/bindgen

# The guests' kernel: the lab kernel, the same with the kernel's bug
# detectors (lab/kernel/xensock-debug.config; docs/lab.md "The debug
# kernel"), or, in the domUs only, Debian's own (lib/guest-kernel.sh).
LAB_KERNEL=${LAB_KERNEL:-lab}
case $LAB_KERNEL in
  lab|debug|debian) ;;
  *) echo "LAB_KERNEL=$LAB_KERNEL: the lab has the kernels 'lab' (default), 'debug' and 'debian'" >&2; exit 2 ;;
esac
export LAB_KERNEL
# the kernel the lab builds (dom0's; the domUs' too, but on debian)
case $LAB_KERNEL in debug) BUILT_KERNEL=debug ;; *) BUILT_KERNEL=lab ;; esac
# The domUs' guest type (docs/lab.md "Guest types").
# mixed: domu1 PV, the others PVH; hvm: HVM with PV drivers (QEMU as
# device model in dom0).
LAB_GUEST=${LAB_GUEST:-pv}
case $LAB_GUEST in
  pv|pvh|mixed|hvm) ;;
  *) echo "LAB_GUEST=$LAB_GUEST: the lab boots its domUs as 'pv' (default), 'pvh', 'mixed' (domu1 PV, the others PVH) or 'hvm'" >&2; exit 2 ;;
esac
export LAB_GUEST

# ---- output -----------------------------------------------------------------
_t0=$(date +%s.%N)
if [[ -t 1 ]]; then C_B=$'\e[1m'; C_R=$'\e[31m'; C_G=$'\e[32m'; C_Y=$'\e[33m'; C_0=$'\e[0m'
else C_B=; C_R=; C_G=; C_Y=; C_0=; fi
elapsed() { awk -v a="$_t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%6.1f", b-a}'; }
say()  { printf '%s[lab %ss]%s %s\n' "$C_B" "$(elapsed)" "$C_0" "$*"; }
warn() { printf '%s[lab %ss] WARNING:%s %s\n' "$C_Y" "$(elapsed)" "$C_0" "$*" >&2; }
die()  { printf '%s[lab %ss] ERROR:%s %s\n' "$C_R" "$(elapsed)" "$C_0" "$*" >&2; exit 1; }

# ---- phases: `phase NAME cmd...` runs cmd, records its wall time ------------
# cmd runs with errexit in force (never in a `||` context, which would turn
# set -e off inside it); a failing cmd ends the script, and the EXIT handler
# records the open phase as FAILED (phase_abort) before printing a summary.
PHASE_NAMES=(); PHASE_SECS=(); PHASE_STATUS=(); CUR_PHASE=; CUR_PHASE_T0=
_phase_close() {
  local d; d=$(awk -v a="$CUR_PHASE_T0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
  PHASE_NAMES+=("$CUR_PHASE"); PHASE_SECS+=("$d"); PHASE_STATUS+=("$1")
  say "== phase $CUR_PHASE $1 (${d}s)"
  CUR_PHASE=
}
phase() {
  CUR_PHASE=$1; CUR_PHASE_T0=$(date +%s.%N); shift
  say "== phase $CUR_PHASE"
  "$@"
  _phase_close "done"
}
phase_abort() { [[ -z $CUR_PHASE ]] || _phase_close FAILED; }

# ---- cache ------------------------------------------------------------------
# Hash of a list of strings/files: stable, short.
inputs_hash() {
  local x
  for x in "$@"; do
    if [[ -f $x ]]; then printf 'file %s\n' "$(basename "$x")"; cat "$x"
    elif [[ -d $x ]]; then printf 'dir %s\n' "$(basename "$x")"
      (cd "$x" && find . -type f ! -name '*.o' ! -name '*.ko' ! -name '.*' | LC_ALL=C sort | xargs -r sha256sum)
    else printf 'str %s\n' "$x"; fi
  done | sha256sum | cut -c1-16
}
pkgver() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo none; }

# Toolchain identity (part of every kernel/module cache key).
toolchain_id() {
  printf 'linux-source=%s rustc=%s rust-src=%s clang=%s lld=%s bindgen=%s' \
    "$(pkgver linux-source-6.12)" "$(pkgver rustc-web)" "$(pkgver rust-web-src)" \
    "$(pkgver clang-14)" "$(pkgver lld-14)" \
    "$("$BINDGEN" --version 2>/dev/null | awk '{print $2}')"
}

# Cache key of the kernel: source package version, toolchain versions, the
# config fragment, our patches to the source (kernel/patches), and the
# recipe version in kernel/build.sh (bumped by hand when the build steps
# change meaning; comment edits do not rebuild).
kernel_fragments() {
  echo "$LAB_DIR/kernel/xensock-lab.config"
  [[ $BUILT_KERNEL != debug ]] || echo "$LAB_DIR/kernel/xensock-debug.config"
}
kernel_key() {
  local patches=() frags
  [[ -d $LAB_DIR/kernel/patches ]] && patches=("$LAB_DIR/kernel/patches")
  mapfile -t frags < <(kernel_fragments)
  # the lab kernel's key is the one it always had (its cache stays valid);
  # another kernel's name is in its key and its directory's name
  local name=kernel; [[ $BUILT_KERNEL == lab ]] || name=kernel-$BUILT_KERNEL
  echo "$name-$(inputs_hash "$(toolchain_id)" "${frags[@]}" \
    "$(grep -m1 '^RECIPE_VERSION=' "$LAB_DIR/kernel/build.sh")" "${patches[@]}")"
}
kernel_dir() { echo "$CACHE/$(kernel_key)"; }

# afx_module OUT: builds af_xen.ko into OUT/af_xen.ko, from this work tree,
# or from AFX_TREE=DIR (holding af-xen-kmod/ and proto/, e.g. from `git
# archive <rev> af-xen-kmod proto | tar -x -C DIR`) to test another version
# of the module; a build directory per work tree (several branches build).
afx_module() {
  if [[ $LAB_KERNEL == debian ]]; then
    echo "af_xen.ko needs a kernel with CONFIG_RUST; LAB_KERNEL=debian's domUs run Debian's, which has none (its scenarios are the user-space transport's)" >&2
    return 1
  fi
  local afx="$CACHE/af-xen-kmod-build-$(basename "$REPO_DIR")"
  [[ $LAB_KERNEL == lab ]] || afx=$afx-$LAB_KERNEL
  if [[ -n ${AFX_TREE:-} ]]; then
    afx=$afx-alt
    local kdir kflags
    kdir=$("$REPO_DIR/lab/kbuild-env" sh -c 'echo "$KDIR"')
    kflags=$("$REPO_DIR/lab/kbuild-env" sh -c 'echo "$KMAKEFLAGS"')
    make -C "$AFX_TREE/af-xen-kmod" AFX_OUT="$afx" KDIR="$kdir" KMAKEFLAGS="$kflags" TEST_HOOKS=1 || return 1
  else
    make -C "$REPO_DIR/af-xen-kmod" LAB=1 AFX_OUT="$afx" || return 1
  fi
  cp "$afx/af-xen-kmod/af_xen.ko" "$1/af_xen.ko"
}

# lab_socat OUT: Debian's socat (a generic client nobody here wrote) in
# OUT/bin, and the libraries it needs beyond the guests' glibc in OUT/lib:
# unpacked from the .debs (cached), not installed
lab_socat() {
  local sr="$CACHE/socat-debs/root"
  if [[ ! -x $sr/usr/bin/socat ]]; then
    mkdir -p "$CACHE/socat-debs"
    (cd "$CACHE/socat-debs" && apt-get download socat libwrap0 && for d in ./*.deb; do dpkg -x "$d" root; done)
  fi
  mkdir -p "$1/bin" "$1/lib"
  cp "$sr/usr/bin/socat" "$1/bin/socat"
  LD_LIBRARY_PATH="$sr/usr/lib/x86_64-linux-gnu" ldd "$sr/usr/bin/socat" \
    | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | grep -v -e '/libc\.so' -e '/ld-linux' \
    | xargs -r cp -L -t "$1/lib"
}

# lab_openmpi ROOT: Debian's Open MPI 4.1 (orterun as mpirun, orted,
# NetPIPE's NPopenmpi, the components, PMIx) at the paths Debian's
# packages use under ROOT, with every library they load from the host;
# not the xensock BTL, which each scenario installs its own way
lab_openmpi() {
  local root=$1 pkglibdir f
  command -v mpicc >/dev/null && command -v NPopenmpi >/dev/null ||
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q openmpi-bin libopenmpi-dev netpipe-openmpi >> "$CACHE/apt.log" 2>&1 || return 1
  pkglibdir=$(ompi_info --path pkglibdir --parsable | cut -d: -f3)
  mkdir -p "$root/usr/bin" "$root/etc" "$root/usr/share" "$root/usr/lib/x86_64-linux-gnu"
  cp -a /usr/lib/x86_64-linux-gnu/openmpi "$root/usr/lib/x86_64-linux-gnu/"
  rm -f "$root$pkglibdir"/mca_btl_xensock.*
  cp -a /usr/lib/x86_64-linux-gnu/pmix2 "$root/usr/lib/x86_64-linux-gnu/"
  rm -rf "$root/usr/lib/x86_64-linux-gnu/openmpi/include"
  cp -a /usr/share/openmpi /usr/share/pmix "$root/usr/share/" 2>/dev/null || cp -a /usr/share/openmpi "$root/usr/share/"
  cp -a /etc/openmpi "$root/etc/"
  cp -L /usr/bin/orterun /usr/bin/orted /usr/bin/NPopenmpi "$root/usr/bin/"
  ln -sf orterun "$root/usr/bin/mpirun"
  # every library the programs and components load, where the host has it
  for f in "$root"/usr/bin/* $(find "$root/usr/lib/x86_64-linux-gnu" -name '*.so*' -type f); do
    ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
  done | sort -u | grep -v -e '/libc\.so' -e '/ld-linux' | while read -r f; do
    mkdir -p "$root$(dirname "$f")"; cp -L -n "$f" "$root$f"
  done
}

# lab_xrsh OUT: OUT/bin/xrsh HOST COMMAND..., the remote launcher mpirun
# uses in the guests (they have no ssh): the command goes to HOST's exec
# service (tests/lab/mpi/mpi.sh, mpi_exec_service)
lab_xrsh() {
  mkdir -p "$1/bin"
  printf '#!/bin/sh\n# xrsh HOST COMMAND...: run COMMAND on HOST through the lab exec service\nh=$1; shift\necho "$*" | exec socat -t 100000 - TCP:$h:2222\n' > "$1/bin/xrsh"
  chmod +x "$1/bin/xrsh"
}

# lab_dpkg ROOT PACKAGE...: Debian's dpkg under ROOT with what it runs
# (GNU tar, ldconfig, start-stop-daemon) and what maintainer scripts call
# (getent, groupadd), all with their libraries; the shared libraries of
# PACKAGE...; and a package database that lists PACKAGE... and what they
# depend on as installed (the host's own entries for them), so the guest,
# which carries the host's copies of the files it uses, can install .debs
# that depend on them
lab_dpkg() {
  local root=$1; shift
  local b f
  for b in /usr/bin/dpkg /usr/bin/dpkg-deb /usr/bin/dpkg-query /usr/bin/dpkg-split /usr/bin/dpkg-trigger \
      /usr/bin/dpkg-divert /usr/bin/dpkg-statoverride /usr/bin/tar /usr/sbin/start-stop-daemon /sbin/ldconfig \
      /usr/bin/getent /usr/sbin/groupadd; do
    [[ -x $b ]] || { echo "lab_dpkg: $b missing on the host" >&2; return 1; }
    mkdir -p "$root$(dirname "$b")"; cp -L "$b" "$root$b"
    ldd "$b" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | grep -v -e '/libc\.so' | while read -r f; do
      mkdir -p "$root$(dirname "$f")"; cp -L -n "$f" "$root$f"
    done
  done
  mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/var/lib/dpkg/triggers" \
    "$root/var/lib/dpkg/alternatives" "$root/etc/dpkg/dpkg.cfg.d" "$root/var/log"
  : > "$root/var/lib/dpkg/available"
  # the shared libraries of PACKAGE... (what the .debs link to)
  for b in "$@"; do
    dpkg -L "$b" | grep -E '^(/usr)?/lib/x86_64-linux-gnu/[^/]+\.so[.0-9]*$' | while read -r f; do
      [[ -f $f ]] || continue
      mkdir -p "$root$(dirname "$f")"; cp -L -n "$f" "$root$f"
    done
  done
  # with everything they depend on, as dpkg checks the whole database
  apt-cache depends --recurse --installed --no-recommends --no-suggests --no-conflicts --no-breaks \
      --no-replaces --no-enhances "$@" | grep -v -e '^ ' -e '^<' | sort -u |
    xargs dpkg-query -s > "$root/var/lib/dpkg/status" || return 1
  # their files lists: empty (the guest has some of their files, not all)
  sed -n 's/^Package: //p' "$root/var/lib/dpkg/status" | xargs dpkg-query -W -f '${binary:Package}\n' |
    while read -r f; do : > "$root/var/lib/dpkg/info/$f.list"; done
  # the kernel runs /sbin/modprobe for a module it needs (an AF_XEN
  # socket's net-pf-19): busybox's, as the guests' other tools
  mkdir -p "$root/sbin"; ln -sf /bin/busybox "$root/sbin/modprobe"; ln -sf /bin/busybox "$root/sbin/depmod"
}

# lab_preload OUT: libxensock_preload.so in OUT/lib, built against the
# host's glibc (the guests run the host's, copied with their binaries),
# with the libgcc_s a Rust cdylib needs
lab_preload() {
  ( cd "$REPO_DIR" && cargo build --release -p xensock-preload ) || return 1
  mkdir -p "$1/lib"
  cp "${CARGO_TARGET_DIR:-$REPO_DIR/target}/release/libxensock_preload.so" "$1/lib/"
  cp -L /lib/x86_64-linux-gnu/libgcc_s.so.1 "$1/lib/"
}

# Make variables for building the kernel and out-of-tree modules.
kmake_vars() {
  printf '%s\n' LLVM=1 "RUSTC=$RUSTC" "HOSTRUSTC=$RUSTC" RUSTDOC=/usr/bin/rustdoc \
    "RUST_LIB_SRC=$RUST_LIB_SRC" "BINDGEN=$BINDGEN"
}
