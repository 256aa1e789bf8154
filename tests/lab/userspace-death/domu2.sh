# userspace-death, domu2: stream through domu1's echo server until domu1 is
# destroyed; the connection must end in ECONNRESET at the agent's gone
# note, not after the lost-peer bound (60 s here).
PEER=$(xlbench xsread data/peer 60)
check advertise xensock-discover advertise
export XENSOCK_PEER_LOST_MS=60000
i=0; H=
while [ $i -lt 30 ]; do
  RUST_LOG=libxensock=info lab_echo hold $PEER 10 300 > /tmp/death.log 2>&1 &
  H=$!
  wait_until 30 grep -q -e 'passed 1 MiB' -e 'lab_echo: error' /tmp/death.log
  grep -q 'passed 1 MiB' /tmp/death.log && break
  wait $H; H=; i=$((i + 1)); sleep 2
done
if [ -n "$H" ]; then
  log "gone-death-streaming"
  watchdog $H 300; rc=$?
  grep -v "^  " /tmp/death.log | grep -E "connected|connection ended|leg|peer|fails|link|ring" | head -n 30
  gap=$(sed -n 's/.*; \([0-9.]*\) ms after the last byte.*/\1/p' /tmp/death.log)
  if [ $rc = 0 ] && grep -q 'peer domain destroyed' /tmp/death.log && [ -n "$gap" ] &&
     awk -v g="$gap" 'BEGIN { exit !(g < 15000) }'; then
    result gone-death PASS "ECONNRESET ${gap} ms after the last byte, at the gone note"
  else
    result gone-death FAIL "rc=$rc, ${gap:-no} ms after the last byte; gone resets logged: $(grep -c 'peer domain destroyed' /tmp/death.log)"
  fi
else
  log "gone-death-no-stream"
  result gone-death FAIL "no stream through domu1's server after $i attempts"
fi
