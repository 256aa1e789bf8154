# packages scenario, domu2: the clients: a stream over xensock, socat
# under xensock run, an MPI job; then dpkg --purge.
. /scenario/packages.sh
. /scenario/mpi.sh
hostname domu2
install_packages
start_advertiser
PEER=$(xlbench xsread data/peer 60)
dd if=/dev/urandom of=/tmp/want bs=1M count=4 2>/dev/null
# the link to domu1 comes up once both sides run xensock and the agent
# made the link directories: retry until a connect goes through
if [ "$MPI_STACK" = kmod ]; then
  check af-xen-stream wait_until 180 sh -c "xen-echo client $PEER 7100 2>>/tmp/echo.err | grep -qx hello"
  check module-loaded-by-socket test -d /sys/module/af_xen
  check status-backend sh -c 'xensock status | tee /dev/stderr | grep -qi "af_xen"'
else
  start_daemon
  check status-backend xensock status
  check xensock-stream-sent wait_until 180 sh -c "timeout 60 xensock connect xen:$PEER:7100 < /tmp/want > /dev/null 2>>/tmp/echo.err"
  sed 's/^/  [daemon] /' /tmp/daemon.log | tail -n 20
fi
tail -n 3 /tmp/echo.err 2>/dev/null
# 4 MiB through socat under the preload library and back (cat on domu1)
# (domu1's listener is up once a plain TCP client gets through: it takes
# TCP clients and co-resident guests' AF_XEN connections alike)
wait_until 120 sh -c "echo | socat -t 5 - TCP:$LAB_NET_DOMU1:7200 >/dev/null"
check xensock-run-socat sh -c "XENSOCK_PRELOAD_LOG=1 xensock run -- socat -t 30 - TCP:$LAB_NET_DOMU1:7200 < /tmp/want > /tmp/got 2> /tmp/socat-c.log && cmp /tmp/want /tmp/got"
if [ "$MPI_STACK" = kmod ]; then
  check xensock-run-on-af-xen sh -c "grep -q 'AF_XEN to dom$PEER' /tmp/socat-c.log || { cat /tmp/socat-c.log; exit 1; }"
else
  # the preload library needs af_xen.ko: without it the program keeps TCP
  check xensock-run-stays-on-tcp sh -c "grep -q 'af_xen.ko is not loaded' /tmp/socat-c.log || { cat /tmp/socat-c.log; exit 1; }"
fi
check xensock-run-not-found-127 sh -c 'xensock run -- /nonexistent; test $? = 127'
# an MPI job across the domUs over the packaged BTL
check mpi-exec-reachable wait_until 300 sh -c "xrsh domu1 true"
# (the stream's bytes as domu1 got them, through the exec service)
[ "$MPI_STACK" = kmod ] || check xensock-stream-intact wait_until 30 sh -c \
  "[ \"\$(xrsh domu1 md5sum /tmp/got | cut -d' ' -f1)\" = \"\$(md5sum /tmp/want | cut -d' ' -f1)\" ]"
across 1 --mca btl self,xensock --mca btl_base_verbose 10 /opt/xensock/bin/xsmpi check --max 1048576 > /tmp/check.log 2>&1
grep -E 'btl:xensock|Using .* btl' /tmp/check.log | sed 's/^/  [mpi] /' | head -n 12
check mpi-xensock-selected test "$(grep -c 'Using xensock btl for send to' /tmp/check.log)" -eq 2
check mpi-check sh -c "grep -q '^xsmpi check ok' /tmp/check.log || { tail -n 30 /tmp/check.log; exit 1; }"
xrsh domu1 touch /tmp/packages.done
# removed again (no xensock socket is open here now)
kill "$ADV" "${DAEMON:-}" 2>/dev/null
sleep 2
if [ "$MPI_STACK" = kmod ]; then
  rmmod af_xen
  check dpkg-purge /usr/bin/dpkg --purge xensock-modules-"$(uname -r)" xensock-mpi xensock
else
  check dpkg-purge /usr/bin/dpkg --purge xensock-mpi xensock
fi
check purged sh -c "! dpkg-query -W xensock >/dev/null 2>&1 && ! test -e /usr/bin/xensock &&
  ! test -e /lib/modules/$(uname -r)/updates/dkms/af_xen.ko && ! grep -qs af_xen /lib/modules/$(uname -r)/modules.alias"
