#!/bin/bash
# Build Xen 4.17's xenstored from Debian's xen source package with symbols
# (-Og -g3, assertions on) and lab/xen/xenstored-diag.patch: it clears
# errno before each request's handler, and before its `conn->in == NULL`
# assertion prints the request it failed to answer (type, length, first
# bytes, handler result, errno) and a backtrace to stderr (and a line to
# syslog), which dom0 shows with @@XENSTORED-GONE. Links against the 4.17
# shared libraries dom0 already carries.
#
#   lab/xen/build-xenstored.sh OUTDIR
#   LAB_XENSTORED=OUTDIR/xenstored lab/run SCENARIO
set -euo pipefail
LAB_DIR=$(cd "$(dirname "$0")/.." && pwd)
. "$LAB_DIR/lib/common.sh"
. "$LAB_DIR/lib/deps.sh"
OUT=${1:?usage: build-xenstored.sh OUTDIR}
mkdir -p "$OUT"
cd "$OUT"
XEN_VERSION=${XEN_VERSION:-any}
ensure_deb_src
if [[ ! -d src ]]; then
  # the newest 4.17 source the mirror serves (bookworm-security's 404s here)
  got=
  for v in $(apt-cache showsrc xen | awk '/^Version: 4\.17/ {print $2}' | sort -rV); do
    rm -f xen_*
    if timeout 600 apt-get source -q --download-only "xen=$v" > apt-source.log 2>&1; then got=$v; break; fi
  done
  [[ -n $got ]] || { cat apt-source.log; echo "no xen 4.17 source package downloadable" >&2; exit 1; }
  echo "$got" > version
  timeout 1800 apt-get build-dep -y -q "xen=$got" > build-dep.log 2>&1 || { tail -20 build-dep.log; exit 1; }
  dpkg-source -x xen_*.dsc src.tmp > /dev/null
  patch -d src.tmp -p1 < "$LAB_DIR/xen/xenstored-diag.patch"
  mv src.tmp src
fi
cd src
[[ -f configure ]] || ./autogen.sh > ../autogen.log 2>&1
[[ -f config.guess ]] || cp /usr/share/misc/config.guess /usr/share/misc/config.sub .
[[ -f config/Tools.mk ]] || ./configure --prefix=/usr --disable-ocamltools --disable-stubdom \
  --disable-qemu-traditional --disable-rombios --disable-seabios --disable-ipxe \
  --disable-pvshim --disable-docs --with-system-qemu=/usr/bin/qemu-system-i386 > ../configure.log 2>&1
make -C tools/include -j"$(nproc)" > ../build.log 2>&1
make -C tools/libs -j"$(nproc)" >> ../build.log 2>&1
make -C tools/xenstore -j"$(nproc)" xenstored debug=y >> ../build.log 2>&1
cp tools/xenstore/xenstored "$OUT/xenstored"
echo "built: $OUT/xenstored (xen $(cat "$OUT/version"), symbols, lab/xen/xenstored-diag.patch)"
