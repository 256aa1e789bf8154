# userspace, domu2: XenStore and discovery checks, then the client:
# checksummed echo through domu1's server, peer death, reconnect.
PEER=$(xlbench xsread data/peer 60)
ME=$(own_domid)
log "I am dom$ME, peer domu1 is dom$PEER"
check xs-client-xenbus lab_echo xs /local/domain/$ME/data --watch
lab_echo xs /local/domain/$ME/data --watch 2>&1 | sed 's/^/  [xs] /'
check advertise xensock-discover advertise
check peers-see-domu1 wait_until 300 sh -c "xensock-discover peers | grep -q '^dom$PEER '"
xensock-discover peers
check lookup-domu1 xensock-discover lookup $LAB_NET_DOMU1
xensock-discover lookup $LAB_NET_DOMU1
# client: retry while the server is not up yet (connection refused)
echo_client() {
  _i=0
  while [ $_i -lt 4 ]; do
    timeout 180 lab_echo client $PEER 7 "$1" && return 0
    _i=$((_i + 1)); sleep 3
  done
  return 1
}
echo_client 8 > /tmp/client.log 2>&1; rc=$?
cat /tmp/client.log
if [ $rc = 0 ]; then result echo-checksum PASS; else result echo-checksum FAIL "rc=$rc"; fi
# peer death: stream until domu1 kills its server (after 2 MiB)
timeout 300 lab_echo hold $PEER 7 60 > /tmp/hold.log 2>&1; rc=$?
cat /tmp/hold.log
if [ $rc = 0 ]; then result peer-death PASS; else result peer-death FAIL "rc=$rc"; fi
echo_client 1 > /tmp/client2.log 2>&1; rc=$?
cat /tmp/client2.log
if [ $rc = 0 ]; then result reconnect-after-death PASS; else result reconnect-after-death FAIL "rc=$rc"; fi
