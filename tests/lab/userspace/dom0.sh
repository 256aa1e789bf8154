# userspace, dom0: XsClient against the real xenstored socket, the
# discovery agent, and a look at the link directories the domUs make.
D1=$(xl domid domu1); D2=$(xl domid domu2)
log "domu1 is dom$D1, domu2 is dom$D2"
ls -l /run/xenstored/ /var/run 2>&1 | head
XENSTORED_PATH=/run/xenstored/socket
[ -S $XENSTORED_PATH ] || XENSTORED_PATH=/var/run/xenstored/socket
export XENSTORED_PATH
log "XsClient and the tools use the xenstored unix socket $XENSTORED_PATH"
check xs-client-socket lab_echo xs /tool/xensock-lab --watch
lab_echo xs /tool/xensock-lab --watch 2>&1 | sed 's/^/  [xs] /'
xensock-agent > /tmp/agent.log 2>&1 &
AGENT=$!
sleep 2
check agent-running kill -0 $AGENT
tail -n 20 /tmp/agent.log
# both domUs advertise; the agent gives each a table naming the other
check agent-tables wait_until 300 sh -c "xenstore-ls /local/domain/$D1/xensock/peers | grep -q '^$D2 ' && xenstore-ls /local/domain/$D2/xensock/peers | grep -q '^$D1 '"
for d in $D1 $D2; do echo "--- dom$d"; xenstore-ls -p /local/domain/$d/data/xensock; xenstore-ls -p /local/domain/$d/xensock; done
check xenstored-alive-1 pidof xenstored
# part (c): Debian's xenstore tools against the real xenstored
. /scenario/xsutils.sh
check xenstored-alive-3 pidof xenstored
# the agent makes each co-resident pair's link directories, nA,rB both ways
# (docs/protocol.md 6.1); the transports keep them
check link-perms wait_until 120 sh -c "xenstore-ls -p /local/domain/$D2/data/xensock/link | grep -q 'n$D2,r$D1' && xenstore-ls -p /local/domain/$D1/data/xensock/link | grep -q 'n$D1,r$D2'"
for d in $D1 $D2; do echo "--- dom$d link"; xenstore-ls -p /local/domain/$d/data/xensock/link; done
# domu2's death-on-TCP test: once its stream through domu1's victim flows
# (domu1's script has ended), the agent says domu1 left, the pair's link
# directories go (the connection moves to TCP), then domu1 is destroyed
if wait_domu domu2 'tcp-death-streaming|tcp-death-no-stream|@@EXIT' 400 && ! wait_domu domu2 'tcp-death-no-stream|@@EXIT' 0; then
  check domu1-done wait_domu domu1 '@@EXIT' 60
  check tcp-death-away xensock-agent away "$D1" host-b
  check tcp-death-unlinked wait_until 60 sh -c "! xenstore-read /local/domain/$D2/data/xensock/link/$D1 >/dev/null 2>&1"
  sleep 5
  check tcp-death-destroy xl destroy domu1
fi
# keep the agent up until the domUs are done
wait_domu domu2 '@@EXIT' 330
wait_domu domu1 '@@EXIT' 60
tail -n 20 /tmp/agent.log
kill $AGENT
# xenstored must survive link setup + xenstore-rm -t
check xenstored-alive-2 pidof xenstored
dmesg | grep -i -E "segfault|xenstored|traps" | tail -n 10
