# packages scenario, domu1: the servers (an echo over xensock, socat under
# xensock run) and the exec service mpirun starts its daemon through.
. /scenario/packages.sh
. /scenario/mpi.sh
hostname domu1
install_packages
start_advertiser
if [ "$MPI_STACK" = kmod ]; then
  # the README's echo server: its first AF_XEN socket loads the module
  xen-echo server 7100 > /tmp/echo.log 2>&1 &
  ECHO=$!
  check module-loaded-by-socket wait_until 30 test -d /sys/module/af_xen
  check status-backend sh -c 'xensock status | tee /dev/stderr | grep -qi "af_xen"'
else
  start_daemon
  check status-backend xensock status
  # a stream's receiver through the daemon (domu2 compares what it got)
  xensock listen 7100 < /dev/null > /tmp/got 2> /tmp/echo.log &
  ECHO=$!
fi
XENSOCK_PRELOAD_LOG=1 xensock run -- socat -t 30 TCP-LISTEN:7200,fork,reuseaddr EXEC:cat > /tmp/socat-s.log 2>&1 &
SOCAT=$!
sleep 3
check xensock-run-server kill -0 $SOCAT
mpi_exec_service
# stay until domu2 is done with the servers here
wait_until 900 test -f /tmp/packages.done
sed 's/^/  [echo] /' /tmp/echo.log
[ -f /tmp/daemon.log ] && sed 's/^/  [daemon] /' /tmp/daemon.log | tail -n 20
sed 's/^/  [socat] /' /tmp/socat-s.log | tail -n 20
# (the receiver may have ended with its stream)
kill "$EXEC_PID" "$ADV" "$SOCAT" "$ECHO" 2>/dev/null || true
