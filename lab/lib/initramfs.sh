# shellcheck shell=bash
# Guest root filesystems (initramfs) for dom0 and the domUs.

# copy_bin ROOT DEST_DIR BIN...: copy executables (symlinks resolved) into
# ROOT/DEST_DIR, with the shared libraries ldd reports, at their own paths.
copy_bin() {
  local root=$1 dest=$2 b l; shift 2
  mkdir -p "$root$dest"
  for b in "$@"; do
    [[ -x $b ]] || die "missing executable $b"
    cp -L "$b" "$root$dest/"
    # static binaries: ldd exits 1 ("not a dynamic executable")
    while read -r l; do
      [[ -n $l && -e $l ]] || continue
      [[ -e $root$l ]] && continue
      mkdir -p "$root$(dirname "$l")"; cp -L "$l" "$root$l"
    done < <(ldd "$b" 2>/dev/null | awk '/=> \// {print $3} /^[[:space:]]*\/[^ ]*ld-linux/ {print $1}')
  done
}

# Files every guest gets: busybox, lab helpers, the scenario, guest files.
common_root() {
  local root=$1
  mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,tmp,run,etc,lab/bin,lab/modules,scenario,opt/xensock,var/log}
  cp /bin/busybox "$root/bin/busybox"
  cp "$LAB_DIR/guest/lib.sh" "$root/lab/lib.sh"
  cp "$LAB_DIR/guest/kernel-check.sh" "$root/lab/kernel-check.sh"
  cp "$XLBENCH" "$root/lab/bin/xlbench"
  copy_bin "$root" /usr/bin /usr/bin/xenstore-read /usr/bin/xenstore-write /usr/bin/xenstore-ls \
    /usr/bin/xenstore-list /usr/bin/xenstore-rm /usr/bin/xenstore-exists /usr/bin/xenstore-watch
  copy_bin "$root" /usr/sbin /sbin/ip /sbin/brctl
  # the scenario: tests/lab/<name>/ (all of it) at /scenario, over the
  # shared directory it includes (SCENARIO_INCLUDE in its scenario.conf)
  if [[ -n ${SCENARIO_INCLUDE:-} ]]; then
    [[ -d $REPO_DIR/tests/lab/$SCENARIO_INCLUDE ]] || die "SCENARIO_INCLUDE: no tests/lab/$SCENARIO_INCLUDE"
    cp -a "$REPO_DIR/tests/lab/$SCENARIO_INCLUDE/." "$root/scenario/"
  fi
  cp -a "$SCENARIO_DIR/." "$root/scenario/"
  # later issues drop our binaries/modules here (--guest-files DIR)
  if [[ -n ${GUEST_FILES:-} ]]; then cp -a "$GUEST_FILES/." "$root/opt/xensock/"; fi
  if [[ -n ${SCENARIO_FILES:-} ]]; then
    # rootfs/ of a scenario's build goes to the guest's / (programs that
    # must sit where their package put them), the rest to /opt/xensock
    (cd "$SCENARIO_FILES" && find . -mindepth 1 -maxdepth 1 ! -name rootfs -exec cp -a {} "$root/opt/xensock/" \;)
    if [[ -d $SCENARIO_FILES/rootfs ]]; then cp -a "$SCENARIO_FILES/rootfs/." "$root/"; fi
  fi
  echo "root:x:0:0:root:/root:/bin/sh" > "$root/etc/passwd"
  echo "root:x:0:" > "$root/etc/group"
  printf '127.0.0.1 localhost\n10.0.0.1 dom0\n10.0.0.2 dom0b\n10.0.0.11 domu1\n10.0.0.12 domu2\n' > "$root/etc/hosts"
}

pack_cpio() { # pack_cpio ROOT OUT.cpio.gz
  (cd "$1" && find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0 | gzip -1) > "$2"
}

build_domu_root() {
  local root=$RUN/domu-root
  rm -rf "$root"; common_root "$root"
  cp "$LAB_DIR/guest/domu-init" "$root/init"
  copy_bin "$root" /usr/bin /usr/bin/iperf3
  # LAB_PERF=1 (host environment): perf, strace and ss in the domUs, for
  # profiles by software clock (the guests have no PMU), system-call
  # counts and TCP socket snapshots; scenarios look for them
  if [[ -n ${LAB_PERF:-} ]]; then
    [[ -x /usr/bin/perf && -x /usr/bin/strace ]] ||
      die "LAB_PERF: perf and strace needed on the host (apt-get install linux-perf strace)"
    copy_bin "$root" /usr/bin /usr/bin/perf /usr/bin/strace /usr/bin/ss
  fi
  # the domU kernel's in-tree modules (the lab kernel's, e.g. rust_minimal;
  # Debian's Xen drivers and the order /init loads them in) + out-of-tree ones
  cp -a "$DOMU_MODULES_LIB/lib" "$root/"
  [[ -z $DOMU_MODULE_LOAD ]] || cp "$DOMU_MODULE_LOAD" "$root/lab/kernel-modules"
  local ko
  for ko in "${MODULE_KOS[@]}"; do cp "$ko" "$root/lab/modules/"; done
  pack_cpio "$root" "$RUN/domu.cpio.gz"
}

build_dom0_root() {
  local root=$RUN/dom0-root
  rm -rf "$root"; common_root "$root"
  cp "$LAB_DIR/guest/dom0-init" "$root/init"
  cp "$XS_TRACEBUF" "$root/lab/xs-tracebuf.so"
  copy_bin "$root" "$XEN_BIN" "$XEN_BIN/xl" "$XEN_BIN/xenstored" "$XEN_BIN/xenconsoled" \
    "$XEN_BIN/xen-init-dom0" "$XEN_BIN/libxl-save-helper" "$XEN_BIN/xenconsole" \
    "$XEN_BIN/xenstore-control"
  # LAB_XENSTORED=PATH: a xenstored of one's own build (same 4.17 libraries)
  # instead of Debian's, e.g. one with symbols and diagnostics
  if [[ -n ${LAB_XENSTORED:-} ]]; then
    [[ -x $LAB_XENSTORED ]] || die "LAB_XENSTORED: $LAB_XENSTORED is not an executable"
    cp "$LAB_XENSTORED" "$root$XEN_BIN/xenstored"
  fi
  # glibc dlopen()s libgcc_s for pthread_cancel: xl create aborts without it
  cp -L /lib/x86_64-linux-gnu/libgcc_s.so.1 "$root/lib/x86_64-linux-gnu/"
  mkdir -p "$root/etc/xen/scripts" "$root/var/lib/xen" "$root/var/log/xen/console"
  ln -sfn ../run "$root/var/run"
  cat > "$root/etc/xen/xl.conf" <<'XL'
# xensock lab: dom0 has fixed memory; never balloon it down for domUs
autoballoon="off"
run_hotplug_scripts=1
XL
  cp "$LAB_DIR/guest/vif-lab" "$root/etc/xen/scripts/vif-lab"
  cp "$DOMU_BZIMAGE" "$root/lab/domu-kernel"
  # HVM domUs: their device model, firmware and its libraries
  [[ -z ${DM_ROOT:-} ]] || cp -a "$DM_ROOT/." "$root/"
  # which hypervisor this is (debian|shadow): scenarios that need log-dirty
  # (xl migrate) report SKIP on Debian's
  echo "$XEN_FLAVOUR" > "$root/lab/xen-flavour"
  local ko
  for ko in "${DOM0_KOS[@]}"; do cp "$ko" "$root/lab/modules/"; done
  cp "$RUN/domu.cpio.gz" "$root/lab/domu.cpio.gz"
  pack_cpio "$root" "$RUN/dom0.cpio.gz"
}
