# packages scenario, domu2: the clients: an AF_XEN stream, socat under
# xensock run, an MPI job; then dpkg --purge.
. /scenario/packages.sh
. /scenario/mpi.sh
hostname domu2
install_packages
start_advertiser
PEER=$(xlbench xsread data/peer 60)
# the link to domu1 comes up once both modules are loaded and the agent
# made the link directories: retry until the echo answers
check af-xen-stream wait_until 180 sh -c "xen-echo client $PEER 7100 2>>/tmp/xen-echo.err | grep -qx hello"
tail -n 3 /tmp/xen-echo.err 2>/dev/null
check module-loaded-by-socket test -d /sys/module/af_xen
check status-module sh -c 'xensock status | tee /dev/stderr | grep -qi "af_xen"'
# 4 MiB through socat under the preload library and back (cat on domu1)
# (domu1's listener is up once a plain TCP client gets through: it takes
# TCP clients and co-resident guests' AF_XEN connections alike)
wait_until 120 sh -c "echo | socat -t 5 - TCP:$LAB_NET_DOMU1:7200 >/dev/null"
dd if=/dev/urandom of=/tmp/want bs=1M count=4 2>/dev/null
check xensock-run-socat sh -c "XENSOCK_PRELOAD_LOG=1 xensock run -- socat -t 30 - TCP:$LAB_NET_DOMU1:7200 < /tmp/want > /tmp/got 2> /tmp/socat-c.log && cmp /tmp/want /tmp/got"
check xensock-run-on-af-xen grep -q "AF_XEN to dom$PEER" /tmp/socat-c.log || cat /tmp/socat-c.log
check xensock-run-not-found-127 sh -c 'xensock run -- /nonexistent; test $? = 127'
# an MPI job across the domUs over the packaged BTL
check mpi-exec-reachable wait_until 300 sh -c "xrsh domu1 true"
across 1 --mca btl self,xensock --mca btl_base_verbose 10 /opt/xensock/bin/xsmpi check --max 1048576 > /tmp/check.log 2>&1
grep -E 'btl:xensock|Using .* btl' /tmp/check.log | sed 's/^/  [mpi] /' | head -n 12
check mpi-xensock-selected test "$(grep -c 'Using xensock btl for send to' /tmp/check.log)" -eq 2
check mpi-check grep -q '^xsmpi check ok' /tmp/check.log || tail -n 30 /tmp/check.log
xrsh domu1 touch /tmp/packages.done
# removed again: the module first (no AF_XEN socket is open here now)
kill "$ADV" 2>/dev/null
sleep 2
rmmod af_xen
check dpkg-purge /usr/bin/dpkg --purge xensock-modules-"$(uname -r)" xensock-mpi xensock
check purged sh -c "! dpkg-query -W xensock >/dev/null 2>&1 && ! test -e /usr/bin/xensock &&
  ! test -e /lib/modules/$(uname -r)/updates/dkms/af_xen.ko && ! grep -q af_xen /lib/modules/$(uname -r)/modules.alias"
