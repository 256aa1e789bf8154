# shellcheck shell=bash
# The device model of HVM domUs (LAB_GUEST=hvm).

# ensure_device_model: for HVM domUs, dom0 runs Debian's QEMU for Xen
# (qemu-system-xen: /usr/libexec/xen-qemu-system-i386, where libxl looks)
# with SeaBIOS and the option ROM of its direct kernel boot. Unpacked from
# the packages (cached), not installed: sets DM_ROOT, a tree to copy
# over dom0's /.
ensure_device_model() {
  DM_ROOT=
  [[ $LAB_GUEST == hvm ]] || return 0
  # (the libraries of spice the host does not have come along)
  local pkgs=(qemu-system-xen libspice-server1 libopus0 libgstreamer-plugins-base1.0-0 liborc-0.4-0) p v key=
  for p in "${pkgs[@]}"; do
    v=$(apt-cache policy "$p" 2>/dev/null | awk '/Candidate:/ {print $2}')
    [[ -n $v && $v != "(none)" ]] || die "LAB_GUEST=hvm: apt knows no $p"
    key="$key $p=$v"
  done
  local dir=$CACHE/device-model-$(inputs_hash "$key")
  DM_ROOT=$dir/root
  if [[ -f $dir/.complete ]]; then say "HVM device model cached: $dir"; return 0; fi
  say "HVM device model:$key (downloaded once into $dir)"
  rm -rf "$dir"; mkdir -p "$dir/deb"; chmod 755 "$dir/deb"
  (cd "$dir/deb" && timeout 600 apt-get download -q ${key} >>"$CACHE/apt.log" 2>&1) ||
    die "apt-get download${key} failed (log: $CACHE/apt.log)"
  local d
  for d in "$dir"/deb/*.deb; do dpkg-deb -x "$d" "$dir/pkg"; done
  mkdir -p "$DM_ROOT/usr/libexec" "$DM_ROOT/usr/share/qemu" "$DM_ROOT/usr/share/seabios" "$DM_ROOT/usr/lib/xen-$XENV/boot"
  cp "$dir/pkg/usr/libexec/xen-qemu-system-i386" "$DM_ROOT/usr/libexec/"
  # its libraries: the host's, but for those the host lacks (spice's)
  LD_LIBRARY_PATH="$dir/pkg/usr/lib/x86_64-linux-gnu" ldd "$DM_ROOT/usr/libexec/xen-qemu-system-i386" \
    | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r l; do
      local to=$l
      [[ $l != "$dir/pkg/"* ]] || to=${l#"$dir/pkg"}
      mkdir -p "$DM_ROOT$(dirname "$to")"; cp -L "$l" "$DM_ROOT$to"
    done
  cp /usr/share/seabios/bios-256k.bin "$DM_ROOT/usr/share/seabios/"
  cp /usr/share/qemu/linuxboot_dma.bin /usr/share/qemu/linuxboot.bin "$DM_ROOT/usr/share/qemu/"
  # it reads a keymap even with its display off
  mkdir -p "$DM_ROOT/usr/share/qemu/keymaps"
  cp /usr/share/qemu/keymaps/en-us "$DM_ROOT/usr/share/qemu/keymaps/"
  cp "/usr/lib/xen-$XENV/boot/hvmloader" "$DM_ROOT/usr/lib/xen-$XENV/boot/"
  rm -rf "$dir/deb" "$dir/pkg"
  touch "$dir/.complete"
}
