# userspace, domu1: echo server (libxensock over /dev/xen), XenStore and
# discovery checks; kills its server mid-transfer for domu2's peer-death check.
PEER=$(xlbench xsread data/peer 60)
ME=$(own_domid)
log "I am dom$ME, peer domu2 is dom$PEER"
ls -l /dev/xen/
# port 9: first-link probe, 7: checksummed echo and reconnect, 8: peer-death stream
lab_echo server 7 8 9 > /tmp/server.log 2>&1 &
SRV=$!
# its log, live on the console
tail -f /tmp/server.log &
check xs-client-xenbus lab_echo xs /local/domain/$ME/data --watch
lab_echo xs /local/domain/$ME/data --watch 2>&1 | sed 's/^/  [xs] /'
check advertise xensock-discover advertise
check peers-see-domu2 wait_until 300 sh -c "xensock-discover peers | grep -q '^dom$PEER '"
xensock-discover peers
# domu2's checksummed echo: connection 1 completes
check echo-server-conn wait_until 240 grep -q 'conn 7\.[0-9]* done' /tmp/server.log
xenstore-ls /local/domain/$ME/data/xensock/link 2>&1 | sed 's/^/  [links] own: /'
# domu2's "hold" connects to port 8: kill the server once 2 MiB went through it
log "waiting for a connection on port 8 to pass 2 MiB, then kill -9 the server"
if wait_until 120 grep -q "conn 8\.[0-9]* passed 2 MiB" /tmp/server.log; then
  # af_xen.ko refuses to load while the user-space transport holds a link
  # (both would own this domain's link nodes), and says why
  xenstore-ls /local/domain/$ME/data/xensock/link 2>&1 | sed 's/^/  [links] before insmod: /'
  if [ -f /opt/xensock/af_xen.ko ]; then
    check kmod-refused-beside-userspace sh -c '! insmod /opt/xensock/af_xen.ko && dmesg | grep "a user-space xensock transport (libxensock) holds this domain.s link to dom'"$PEER"'"'
    [ -d /sys/module/af_xen ] && rmmod af_xen
  else
    result kmod-refused-beside-userspace SKIP "no af_xen.ko for this kernel ($(uname -r))"
  fi
  kill -9 $SRV; log "killed the echo server (pid $SRV) at $(date +%s)"
  # reap it (a zombie still answers kill -0): 137 is death by SIGKILL
  wait $SRV 2>/dev/null; rc=$?
  if [ $rc = 137 ]; then result server-killed PASS; else result server-killed FAIL "exit status $rc"; fi
else
  result server-killed FAIL "no connection on port 8 reached 2 MiB"
  kill -9 $SRV
fi
# a new server process (new transport, withdraws the old links) for domu2's reconnect
lab_echo server 7 > /tmp/server2.log 2>&1 &
SRV2=$!
tail -f /tmp/server2.log &
check server-restart wait_until 120 grep -q 'conn 7\.[0-9]* done' /tmp/server2.log
kill $SRV2 2>/dev/null; wait $SRV2 2>/dev/null
# domu2's next process writes 8 MiB and exits with its connection open:
# every byte it wrote arrives here, in order, then EOF (as over TCP)
lab_echo sink 11 8 > /tmp/sink.log 2>&1 &
watchdog $! 240; rc=$?
grep -v '^  ' /tmp/sink.log
if [ $rc = 0 ]; then
  result exit-delivers-what-was-written PASS "$(grep '^sink:' /tmp/sink.log)"
else
  result exit-delivers-what-was-written FAIL "$(grep '^sink:' /tmp/sink.log || echo "rc=$rc")"
fi
xensock-discover peers
# every process exited: this domain's XenStore still answers (the xenbus
# deadlock left it hung in xs_talkv)
check xenbus-alive timeout 20 xenstore-read domid
# the victim of domu2's death-on-TCP test outlives this script (this domain
# stays up after @@EXIT): dom0 has the agent say domu1 left (the connection
# goes to TCP), then destroys this domain
lab_echo server 10 > /tmp/victim.log 2>&1 &
log "victim server on port 10 (pid $!)"
