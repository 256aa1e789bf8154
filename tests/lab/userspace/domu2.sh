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
# link nodes as this domain sees them (its own, and the peer's offer to it)
links() {
  echo "  [links] own:"; xenstore-ls /local/domain/$ME/data/xensock/link 2>&1 | sed 's/^/  [links]   /'
  echo "  [links] peer's link/$ME:"; xenstore-ls /local/domain/$PEER/data/xensock/link/$ME 2>&1 | sed 's/^/  [links]   /'
}
# run_retry CMD...: attempt 1 with the library's defaults (2 s link timeout),
# attempts 2-4 with LAB_LINK_TIMEOUT=30 (a longer link timeout, same library)
run_retry() {
  _i=1
  while [ $_i -le 4 ]; do
    log "attempt $_i: $*"
    if [ $_i = 1 ]; then timeout 180 "$@"; else LAB_LINK_TIMEOUT=30 timeout 180 "$@"; fi
    _r=$?
    [ $_r = 0 ] && return 0
    links
    # only setup errors (rc 2: connect failed) are retried
    [ $_r = 2 ] || return $_r
    _i=$((_i + 1)); sleep 3
  done
  return 2
}
run_retry lab_echo client $PEER 7 8; rc=$?
if [ $rc = 0 ]; then result echo-checksum PASS; else result echo-checksum FAIL "rc=$rc"; fi
links
# peer death: stream until domu1 kills its server (after 2 MiB)
run_retry lab_echo hold $PEER 7 60; rc=$?
if [ $rc = 0 ]; then result peer-death PASS; else result peer-death FAIL "rc=$rc"; fi
links
run_retry lab_echo client $PEER 7 1; rc=$?
if [ $rc = 0 ]; then result reconnect-after-death PASS; else result reconnect-after-death FAIL "rc=$rc"; fi
