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
# watchdog PID SECS: wait for PID; after SECS show where its threads sleep
# (a client once hung after printing "checksum OK"), kill -9 it. Its status.
watchdog() {
  _t=0
  while kill -0 $1 2>/dev/null && [ $_t -lt $2 ]; do sleep 1; _t=$((_t + 1)); done
  if kill -0 $1 2>/dev/null; then
    log "pid $1 still alive after $2 s:"
    for _k in /proc/$1/task/*; do echo "  [hang] $_k wchan=$(cat $_k/wchan 2>/dev/null) $(grep State $_k/status)"; done
    kill -9 $1; sleep 2
    kill -0 $1 2>/dev/null && { echo "  [hang] still there after SIGKILL: $(grep State /proc/$1/status)"; return 125; }
  fi
  wait $1
}
# run_retry CMD...: attempt 1 with the library's defaults (2 s link timeout),
# attempts 2-4 with LAB_LINK_TIMEOUT=30 (a longer link timeout, same library)
run_retry() {
  _i=1
  while [ $_i -le 4 ]; do
    log "attempt $_i: $*"
    if [ $_i = 1 ]; then "$@" & else LAB_LINK_TIMEOUT=30 "$@" & fi
    watchdog $! 90; _r=$?
    [ $_r = 0 ] && return 0
    links
    # only setup errors (rc 2: connect failed) are retried
    [ $_r = 2 ] || return $_r
    _i=$((_i + 1)); sleep 3
  done
  return 2
}
# the first link between the two domains, with a 30 s link timeout (the
# library's 2 s failed every first connect in earlier runs): how long does it take?
LAB_LINK_TIMEOUT=30 lab_echo client $PEER 9 1 > /tmp/first.log 2>&1 &
watchdog $! 90; rc=$?
grep -v "^@@METRIC" /tmp/first.log
ms=$(grep '^connect_ms' /tmp/first.log | cut -d' ' -f2)
[ -n "$ms" ] && metric userspace.first_link_connect_ms "$ms" ms
if [ $rc = 0 ]; then result first-link PASS; else result first-link FAIL "rc=$rc"; links; fi
run_retry lab_echo client $PEER 7 8; rc=$?
if [ $rc = 0 ]; then result echo-checksum PASS; else result echo-checksum FAIL "rc=$rc"; fi
links
# peer death: stream until domu1 kills its server (after 2 MiB)
run_retry lab_echo hold $PEER 8 60; rc=$?
if [ $rc = 0 ]; then result peer-death PASS; else result peer-death FAIL "rc=$rc"; fi
links
run_retry lab_echo client $PEER 7 1; rc=$?
if [ $rc = 0 ]; then result reconnect-after-death PASS; else result reconnect-after-death FAIL "rc=$rc"; fi
