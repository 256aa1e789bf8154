# packages scenario, domu1: the servers (xen-echo, socat under xensock run)
# and the exec service mpirun starts its daemon through.
. /scenario/packages.sh
. /scenario/mpi.sh
hostname domu1
install_packages
start_advertiser
# the README's echo server: its first AF_XEN socket loads the module
xen-echo server 7100 > /tmp/xen-echo.log 2>&1 &
check module-loaded-by-socket wait_until 30 test -d /sys/module/af_xen
check status-module sh -c 'xensock status | tee /dev/stderr | grep -qi "af_xen"'
XENSOCK_PRELOAD_LOG=1 xensock run -- socat -t 30 TCP-LISTEN:7200,fork,reuseaddr EXEC:cat > /tmp/socat-s.log 2>&1 &
SOCAT=$!
sleep 3
check xensock-run-server kill -0 $SOCAT
mpi_exec_service
# stay until domu2 is done with the servers here
wait_until 900 test -f /tmp/packages.done
sed 's/^/  [xen-echo] /' /tmp/xen-echo.log
sed 's/^/  [socat] /' /tmp/socat-s.log | tail -n 20
kill "$EXEC_PID" "$ADV" "$SOCAT" 2>/dev/null
