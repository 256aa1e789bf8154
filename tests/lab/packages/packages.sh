# packages scenario, both domUs: install the packages and start what their
# units start (sourced by domu1.sh and domu2.sh).
DEBS=/opt/xensock/debs
# Debian's dpkg is /usr/bin/dpkg; the guests' busybox sh would run its
# own dpkg applet for a bare `dpkg`, whatever PATH says
# install_packages: xensock, xensock-mpi and this kernel's af_xen.ko, as
# one /usr/bin/dpkg -i (dpkg orders them); checks what they put where
install_packages() {
  check module-not-loaded test ! -d /sys/module/af_xen
  check dpkg-install sh -c "/usr/bin/dpkg -i $DEBS/xensock_*.deb $DEBS/xensock-mpi_*.deb $DEBS/xensock-modules-$(uname -r)_*.deb > /tmp/dpkg.log 2>&1"
  sed 's/^/  [dpkg] /' /tmp/dpkg.log
  check installed sh -c "for p in xensock xensock-mpi xensock-modules-$(uname -r); do
      dpkg-query -W -f='\${Status}\n' \$p | grep -qx 'install ok installed' || { echo \"\$p: \$(dpkg-query -W -f='\${Status}' \$p)\"; exit 1; }
    done
    for f in /usr/bin/xensock /usr/bin/xensock-discover /usr/lib/x86_64-linux-gnu/xensock/libxensock_preload.so \
        /lib/modules/$(uname -r)/updates/dkms/af_xen.ko /usr/share/man/man1/xensock.1.gz; do
      test -f \$f || { echo \"missing \$f\"; exit 1; }
    done
    btl=\$(/usr/bin/dpkg -L xensock-mpi | grep '/mca_btl_xensock.so\$') && test -f \"\$btl\"
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
