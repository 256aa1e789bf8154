# shellcheck shell=bash
# Host dependencies: Debian packages (bookworm + bookworm-backports), bindgen
# from crates.io, the Xen hypervisor image extracted from its .deb.

HOST_PKGS=(
  # hypervisor user space (copied into the dom0 initramfs) + vchan headers/libs
  xen-utils-4.17 xenstore-utils libxen-dev
  # guest user space
  busybox-static iperf3 bridge-utils iproute2
  # guest kernel: source + LLVM/Rust toolchain (rustc-web = Debian rustc with
  # the matching std source in rust-web-src; cargo-web builds bindgen)
  linux-source-6.12 rustc-web rust-web-src cargo-web
  clang lld llvm libclang-dev
  bc flex bison libelf-dev libssl-dev cpio zstd xz-utils kmod make gcc libc6-dev
  python3 rsync perl patch
)
BACKPORTS_PKGS=(qemu-system-x86)
BINDGEN_VERSION=0.72.1

ensure_backports_source() {
  if grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then return 0; fi
  say "adding bookworm-backports apt source (/etc/apt/sources.list.d/xensock-lab-backports.sources)"
  cat > /etc/apt/sources.list.d/xensock-lab-backports.sources <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  NEED_UPDATE=1
}

missing_pkgs() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"
  done
}

install_deps() {
  [[ $(id -u) -eq 0 ]] || die "lab/run must run as root (it installs packages and runs QEMU)"
  [[ -r /etc/os-release ]] && . /etc/os-release
  [[ ${VERSION_CODENAME:-} == bookworm ]] || warn "tested on Debian bookworm only (this is ${PRETTY_NAME:-unknown})"
  NEED_UPDATE=0
  ensure_backports_source
  local miss bmiss
  miss=$(missing_pkgs "${HOST_PKGS[@]}")
  bmiss=$(missing_pkgs "${BACKPORTS_PKGS[@]}")
  if [[ -n $bmiss ]] || ! qemu-system-x86_64 --version 2>/dev/null | grep -qE 'version (9|1[0-9])\.'; then
    bmiss=${BACKPORTS_PKGS[*]}
  fi
  if [[ -n $miss || -n $bmiss ]]; then
    export DEBIAN_FRONTEND=noninteractive
    if [[ $NEED_UPDATE = 1 ]] || [[ -z $(find /var/lib/apt/lists -maxdepth 1 -name '*backports*Packages*' -mmin -1440 2>/dev/null) ]]; then
      say "apt-get update"
      timeout 600 apt-get update -q >>"$CACHE/apt.log" 2>&1 || { tail -n 20 "$CACHE/apt.log"; die "apt-get update failed"; }
    fi
    # shellcheck disable=SC2086
    [[ -z $miss ]] || { say "installing: $(echo $miss)"; timeout 1200 apt-get install -y -q --no-install-recommends $miss >>"$CACHE/apt.log" 2>&1 || { tail -n 20 "$CACHE/apt.log"; die "apt-get install failed (log: $CACHE/apt.log)"; }; }
    # shellcheck disable=SC2086
    [[ -z $bmiss ]] || { say "installing from bookworm-backports: $bmiss"; timeout 1200 apt-get install -y -q --no-install-recommends -t bookworm-backports $bmiss >>"$CACHE/apt.log" 2>&1 || { tail -n 20 "$CACHE/apt.log"; die "apt-get install (backports) failed (log: $CACHE/apt.log)"; }; }
  fi
  qemu-system-x86_64 --version | head -1 | grep -qE 'version (9|1[0-9])\.' \
    || die "need QEMU >= 9 from bookworm-backports, have: $(qemu-system-x86_64 --version | head -1)"
  [[ -d $RUST_LIB_SRC/core ]] || die "rust-web-src not found at $RUST_LIB_SRC"
  ensure_bindgen
}

ensure_bindgen() {
  if [[ -x $BINDGEN ]] && "$BINDGEN" --version | grep -q "$BINDGEN_VERSION"; then return 0; fi
  say "building bindgen-cli $BINDGEN_VERSION from crates.io (cargo install --locked, ~2 min)"
  mkdir -p "$CACHE/tools"
  # Debian's cargo + rustc (rustc-web), not whatever rustup put first in PATH.
  CARGO_HOME=$CACHE/tools/cargo-home RUSTC=$RUSTC timeout 1500 /usr/bin/cargo install --locked \
    --root "$CACHE/tools" bindgen-cli --version "$BINDGEN_VERSION" >"$CACHE/tools/bindgen-build.log" 2>&1 \
    || { tail -30 "$CACHE/tools/bindgen-build.log"; die "cargo install bindgen-cli failed"; }
}

# Xen hypervisor: the .deb is downloaded and unpacked, never installed (the
# host keeps booting its own kernel); QEMU needs the uncompressed ELF.
ensure_xen_image() {
  local v; v=$(apt-cache policy xen-hypervisor-$XENV-amd64 | awk '/Candidate:/{print $2}')
  [[ -n $v && $v != "(none)" ]] || die "xen-hypervisor-$XENV-amd64 not available from apt"
  XEN_VERSION=$v
  XEN_DIR=$CACHE/xen-${v//[:+~]/_}
  XEN_IMAGE=$XEN_DIR/xen
  if [[ -s $XEN_IMAGE ]]; then
    [[ ${XEN_FLAVOUR:-debian} = debian ]] || ensure_xen_flavour
    return 0
  fi
  say "fetching xen-hypervisor-$XENV-amd64 $v"
  local tmp; tmp=$(mktemp -d "$CACHE/.xen.XXXX")
  chmod 755 "$tmp"   # apt-get download drops privileges to _apt when it can
  (cd "$tmp" && timeout 600 apt-get download -q "xen-hypervisor-$XENV-amd64=$v" >>"$CACHE/apt.log" 2>&1) || die "apt-get download xen-hypervisor failed"
  dpkg -x "$tmp"/xen-hypervisor-*.deb "$tmp/root"
  zcat "$tmp/root/boot/xen-$XENV-amd64.gz" > "$tmp/xen"
  mkdir -p "$XEN_DIR"
  cp "$tmp"/xen-hypervisor-*.deb "$tmp/root/boot/xen-$XENV-amd64.config" "$XEN_DIR/"
  mv "$tmp/xen" "$XEN_IMAGE"
  rm -rf "$tmp"
  [[ ${XEN_FLAVOUR:-debian} = debian ]] || ensure_xen_flavour
}

# XEN_FLAVOUR=shadow: the same Xen version rebuilt from Debian's source with
# CONFIG_SHADOW_PAGING=y (PV log-dirty, needed by `xl migrate`).
ensure_xen_flavour() {
  [[ $XEN_FLAVOUR = shadow ]] || die "unknown Xen flavour '$XEN_FLAVOUR' (debian|shadow)"
  local key dir
  key=xen-shadow-$(inputs_hash "$XEN_VERSION" "$(gcc -dumpfullversion)" \
    "$(grep -m1 '^RECIPE_VERSION=' "$LAB_DIR/xen/build-shadow.sh")")
  dir=$CACHE/$key
  if [[ ! -f $dir/.complete ]]; then
    ensure_deb_src
    [[ -f $XEN_DIR/xen-$XENV-amd64.config ]] || dpkg --fsys-tarfile "$XEN_DIR"/xen-hypervisor-*.deb \
      | tar -xO "./boot/xen-$XENV-amd64.config" > "$XEN_DIR/xen-$XENV-amd64.config"
    say "building Xen $XEN_VERSION with CONFIG_SHADOW_PAGING=y into $dir (first time only)"
    "$LAB_DIR/xen/build-shadow.sh" "$dir" "$XEN_DIR/xen-$XENV-amd64.config" "$XEN_VERSION" > "$dir.log" 2>&1 \
      || { tail -n 30 "$dir.log"; die "Xen shadow build failed (log: $dir.log)"; }
  fi
  XEN_IMAGE=$dir/xen
}

ensure_deb_src() {
  grep -rqs '^Types: deb-src' /etc/apt/sources.list.d/ && apt-cache showsrc xen 2>/dev/null | grep -q "^Version: $XEN_VERSION\$" && return 0
  say "adding deb-src apt sources (/etc/apt/sources.list.d/xensock-lab-src.sources)"
  cat > /etc/apt/sources.list.d/xensock-lab-src.sources <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  timeout 600 apt-get update -q >>"$CACHE/apt.log" 2>&1 || die "apt-get update failed"
}
