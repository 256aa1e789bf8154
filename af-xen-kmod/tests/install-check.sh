#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# The module's install paths, against the lab kernel (built by lab/run):
# `make install` puts af_xen.ko where depmod finds it and its net-pf alias
# makes socket(AF_XEN) load it; xensock.h and xensock.pc let a C program
# build with pkg-config; `make dkms-source` gives a tree DKMS builds.
# Everything goes to a temporary root; nothing of the host is touched but
# the dkms and pkgconf packages, installed if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
eval "$(../lab/kbuild-env)"
release=$(cat "$KDIR/include/config/kernel.release")

for tool in pkg-config:pkgconf dkms:dkms; do
  command -v "${tool%%:*}" >/dev/null ||
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${tool#*:}" >/dev/null
done

echo "--- make install (module, depmod, header, pkg-config)"
make -s install INSTALL_MOD_PATH="$root" DESTDIR="$root" PREFIX=/usr AFX_OUT="$root/build" >/dev/null 2>&1
test -f "$root/lib/modules/$release/updates/af_xen.ko"
grep -qx "alias net-pf-19 af_xen" "$root/lib/modules/$release/modules.alias"
test -f "$root/usr/include/xensock.h"
cflags=$(PKG_CONFIG_SYSROOT_DIR="$root" PKG_CONFIG_LIBDIR="$root/usr/lib/pkgconfig" pkg-config --cflags xensock)
cat > "$root/prog.c" <<'C'
#include <xensock.h>
int main(void) { struct sockaddr_xen a = { 0 }; return (int)sizeof(a) - 16; }
C
cc $cflags -o "$root/prog" "$root/prog.c"
"$root/prog"

echo "--- make uninstall"
make -s uninstall INSTALL_MOD_PATH="$root" DESTDIR="$root" PREFIX=/usr AFX_OUT="$root/build" >/dev/null 2>&1
! ls "$root/lib/modules/$release/updates/"af_xen.ko* >/dev/null 2>&1
! grep -q "af_xen" "$root/lib/modules/$release/modules.alias"
test ! -e "$root/usr/include/xensock.h" && test ! -e "$root/usr/lib/pkgconfig/xensock.pc"

echo "--- a kernel without Rust support: refused at once, with what to use instead"
mkdir -p "$root/norust/include/config"
touch "$root/norust/Makefile"
echo "CONFIG_XEN=y" > "$root/norust/.config"
if out=$(make -s KDIR="$root/norust" AFX_OUT="$root/build-norust" 2>&1); then
  echo "built against a kernel without CONFIG_RUST"; exit 1
fi
grep -q "without Rust support" <<<"$out" && grep -q "user-space transport" <<<"$out"
test ! -e "$root/build-norust"

echo "--- DKMS: build from make dkms-source"
make -s dkms-source DESTDIR="$root/dkms-src"
test -f "$root/dkms-src/usr/src/af_xen-0.1.0/COPYING"
mkdir -p "$root/dkms-tree"
# the lab kernel's toolchain, as for `make` (LLVM=1 is in dkms.conf)
export KMAKEFLAGS_EXTRA="${KMAKEFLAGS/LLVM=1/}"
dkms add --sourcetree "$root/dkms-src/usr/src" --dkmstree "$root/dkms-tree" -m af_xen -v 0.1.0 >/dev/null
dkms build --sourcetree "$root/dkms-src/usr/src" --dkmstree "$root/dkms-tree" \
  -m af_xen -v 0.1.0 -k "$release" --kernelsourcedir "$KDIR" >/dev/null
ko="$root/dkms-tree/af_xen/0.1.0/$release/x86_64/module/af_xen.ko"
test -f "$ko"
# a user's build has none of the lab's test hooks (LAB=1 or TEST_HOOKS=1)
parms=$(modinfo -F parm "$ko" | cut -d: -f1 | tr '\n' ' ')
for p in hostile_test inject_bad_record inject_bad_dir inject_ring_offers; do
  case " $parms" in *" $p "*) echo "DKMS's af_xen.ko has the test hook $p"; exit 1 ;; esac
done
case " $parms" in *" family "*) ;; *) echo "DKMS's af_xen.ko lists no parameters ($parms)"; exit 1 ;; esac
echo "install paths: ok ($release)"
