# packages scenario, both domUs: install the packages and start what their
# units start (sourced by domu1.sh and domu2.sh).
# Debian's dpkg is /usr/bin/dpkg: the guests' busybox sh would run its own
# dpkg applet for a bare `dpkg`, whatever PATH says. MPI_STACK (mpi.params)
# says which transport the guests run: kmod (af_xen.ko from its package) or
# userspace (Debian's kernel: `xensock daemon`).
DEBS=/opt/xensock/debs
# install_packages: xensock, xensock-mpi and (kmod) this kernel's
# af_xen.ko, in one dpkg -i (dpkg orders them); checks what they put where
install_packages() {
  _debs="$DEBS/xensock_*.deb $DEBS/xensock-mpi_*.deb"
  _pkgs="xensock xensock-mpi"
  if [ "$MPI_STACK" = kmod ]; then
    check module-not-loaded test ! -d /sys/module/af_xen
    _debs="$_debs $DEBS/xensock-modules-$(uname -r)_*.deb"
    _pkgs="$_pkgs xensock-modules-$(uname -r)"
  fi
  check dpkg-install sh -c "/usr/bin/dpkg -i $_debs > /tmp/dpkg.log 2>&1"
  sed 's/^/  [dpkg] /' /tmp/dpkg.log
  check installed sh -c "for p in $_pkgs; do
      dpkg-query -W -f='\${Status}\n' \$p | grep -qx 'install ok installed' || { echo \"\$p: \$(dpkg-query -W -f='\${Status}' \$p)\"; exit 1; }
    done
    for f in /usr/bin/xensock /usr/bin/xensock-discover /usr/lib/x86_64-linux-gnu/xensock/libxensock_preload.so \
        /usr/share/man/man1/xensock.1.gz; do
      test -f \$f || { echo \"missing \$f\"; exit 1; }
    done
    btl=\$(/usr/bin/dpkg -L xensock-mpi | grep '/mca_btl_xensock.so\$') && test -f \"\$btl\""
  [ "$MPI_STACK" = kmod ] && check module-installed sh -c "test -f /lib/modules/$(uname -r)/updates/dkms/af_xen.ko &&
    grep -Eq '^alias net[-_]pf[-_]19 af_xen\$' /lib/modules/$(uname -r)/modules.alias"
  check group-created sh -c "grep '^xensock:' /etc/group || { cat /etc/group; exit 1; }"
}
# unit_command UNIT: the command its ExecStart runs (no systemd here)
unit_command() { sed -n 's/^ExecStart=//p' "/usr/lib/systemd/system/$1"; }
start_advertiser() {
  $(unit_command xensock-advertise.service) > /tmp/advertise.log 2>&1 &
  ADV=$!
  check advertise wait_until 30 xenstore-read data/xensock/addrs
  sed "s/^/  [advertise] /" /tmp/advertise.log | tail -n 5
}
# start_daemon: without the module, the guest's user-space transport for
# every process, as xensock-daemon.service runs it (RuntimeDirectory=)
start_daemon() {
  mkdir -p /run/xensock
  $(unit_command xensock-daemon.service) < /dev/null > /tmp/daemon.log 2>&1 &
  DAEMON=$!
  check daemon-running wait_until 30 test -S /run/xensock/daemon.sock
}
