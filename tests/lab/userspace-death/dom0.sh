# userspace-death, dom0: the agent; once domu2 streams through domu1, away
# and back (the connection gets its carrier switch and returns to a ring),
# then domu1 is destroyed without a move note.
D1=$(xl domid domu1); D2=$(xl domid domu2)
log "domu1 is dom$D1, domu2 is dom$D2"
xensock-agent > /tmp/agent.log 2>&1 &
AGENT=$!
sleep 2
check agent-running kill -0 $AGENT
check agent-tables wait_until 300 sh -c "xenstore-ls /local/domain/$D1/xensock/peers | grep -q '^$D2 ' && xenstore-ls /local/domain/$D2/xensock/peers | grep -q '^$D1 '"
link_up() { [ "$(xenstore-read /local/domain/$D2/data/xensock/link/$D1/state 2>/dev/null)" = 4 ]; }
if wait_domu domu2 'gone-death-streaming|gone-death-no-stream' 400 && ! wait_domu domu2 'gone-death-no-stream' 0; then
  check away xensock-agent away "$D1" host-b
  check unlinked wait_until 60 sh -c "! xenstore-read /local/domain/$D2/data/xensock/link/$D1 >/dev/null 2>&1"
  sleep 3
  check back xensock-agent back "$D1"
  check relinked wait_until 120 link_up
  sleep 5
  log "destroying domu1 at $(uptime_s)"
  check destroy xl destroy domu1
  check gone-noted wait_until 30 xenstore-read "/local/domain/$D2/xensock/gone/$D1"
fi
wait_domu domu2 '@@EXIT' 330
tail -n 20 /tmp/agent.log
kill $AGENT
