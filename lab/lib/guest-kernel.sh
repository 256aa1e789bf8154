# shellcheck shell=bash
# The domUs' kernel.
#
# LAB_KERNEL=lab|debug: the domUs run the same kernel as dom0 (KDIR).
# LAB_KERNEL=debian: dom0 runs the lab kernel, the domUs Debian's own
# packaged 6.12 kernel (linux-image-6.12-amd64's current version, or
# LAB_DEBIAN_KERNEL=<package>): no project patches, no CONFIG_RUST, so no
# af_xen.ko; the user-space transport is the one that runs there. Its Xen
# drivers are modules, loaded by the domU's /init in the order kept in
# /lab/kernel-modules.
# LAB_GUEST=pv|pvh|mixed|hvm (default pv): the domUs' guest type (xl's
# `type=`; mixed: domu1 PV, the others PVH; hvm: HVM with PV drivers, its
# device model a QEMU in dom0, lib/device-model.sh).

# Modules a domU needs from a kernel that builds its Xen drivers as
# modules: netfront (its network), xenfs (/proc/xen), the user-space
# transport's devices (/dev/xen/{evtchn,gntdev,gntalloc}) and privcmd.
DOMU_KERNEL_MODULES=(xen-netfront xenfs xen-evtchn xen-gntdev xen-gntalloc xen-privcmd)

# ensure_domu_kernel: sets DOMU_BZIMAGE (the domUs' kernel image),
# DOMU_MODULES_LIB (a directory whose lib/ goes to the domUs' /lib) and
# DOMU_MODULE_LOAD (a file: module paths under /lib, in load order; empty
# when the kernel needs none loaded).
ensure_domu_kernel() {
  if [[ $LAB_KERNEL != debian ]]; then
    DOMU_BZIMAGE=$KDIR/bzImage; DOMU_MODULES_LIB=$KDIR/modules; DOMU_MODULE_LOAD=
    return 0
  fi
  local pkg ver
  pkg=${LAB_DEBIAN_KERNEL:-$(apt-cache depends linux-image-6.12-amd64 2>/dev/null | awk '/Depends: linux-image-6/ {print $2; exit}')}
  [[ -n $pkg ]] || die "LAB_KERNEL=debian: apt knows no linux-image-6.12-amd64 (is bookworm-backports or bookworm-security in the sources?)"
  ver=$(apt-cache policy "$pkg" 2>/dev/null | awk '/Candidate:/ {print $2}')
  [[ -n $ver && $ver != "(none)" ]] || die "LAB_KERNEL=debian: no installable version of $pkg"
  local dir=$CACHE/kernel-debian-$pkg-$ver
  DOMU_BZIMAGE=$dir/vmlinuz; DOMU_MODULES_LIB=$dir/modules; DOMU_MODULE_LOAD=$dir/load-order
  if [[ -f $dir/.complete ]]; then say "Debian's kernel cached: $dir"; return 0; fi
  say "Debian's kernel for the domUs: $pkg $ver (downloaded once into $dir)"
  rm -rf "$dir"; mkdir -p "$dir/deb"
  chmod 755 "$dir/deb"   # apt-get download drops privileges to _apt when it can
  (cd "$dir/deb" && timeout 600 apt-get download -q "$pkg=$ver" >>"$CACHE/apt.log" 2>&1) ||
    die "apt-get download $pkg=$ver failed (log: $CACHE/apt.log)"
  dpkg-deb -x "$dir"/deb/*.deb "$dir/root"
  local kver
  kver=$(basename "$(find "$dir/root/lib/modules" -mindepth 1 -maxdepth 1 -type d | head -n 1)")
  [[ -n $kver ]] || die "$pkg has no /lib/modules/<version>"
  cp "$dir/root/boot/vmlinuz-$kver" "$DOMU_BZIMAGE"
  cp "$dir/root/boot/config-$kver" "$dir/config"
  # the modules, each after what it depends on (modinfo's depends=),
  # uncompressed: busybox's insmod reads the file itself
  local -A placed=()
  : > "$DOMU_MODULE_LOAD"
  place_module() {
    local name=$1 src rel dep
    [[ -z ${placed[$name]:-} ]] || return 0
    src=$(find "$dir/root/lib/modules/$kver" -name "$name.ko*" -print -quit)
    [[ -n $src ]] || die "$pkg has no module $name"
    for dep in $(/sbin/modinfo -F depends "$src" | tr , ' '); do place_module "$dep"; done
    rel=${src#"$dir/root/"}; rel=${rel%.xz}
    mkdir -p "$dir/modules/$(dirname "$rel")"
    case $src in
      *.xz) xz -dc "$src" > "$dir/modules/$rel" ;;
      *) cp "$src" "$dir/modules/$rel" ;;
    esac
    echo "/$rel" >> "$DOMU_MODULE_LOAD"
    placed[$name]=1
  }
  local m
  for m in "${DOMU_KERNEL_MODULES[@]}"; do place_module "$m"; done
  rm -rf "$dir/deb" "$dir/root"
  touch "$dir/.complete"
  say "Debian's kernel $kver; modules: $(xargs -n1 basename < "$DOMU_MODULE_LOAD" | tr '\n' ' ')"
}
