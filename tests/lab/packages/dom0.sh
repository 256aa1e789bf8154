# packages scenario, dom0: xensock-agent from its package, started as its
# unit says, until both domUs are done.
D1=$(xl domid domu1); D2=$(xl domid domu2)
check dpkg-install sh -c '/usr/bin/dpkg -i /opt/xensock/debs/xensock-agent_*.deb > /tmp/dpkg.log 2>&1'
sed 's/^/  [dpkg] /' /tmp/dpkg.log
check installed sh -c "dpkg-query -W -f='\${Status}' xensock-agent | grep -qx 'install ok installed' &&
  test -x /usr/bin/xensock-agent && test -f /usr/lib/systemd/system/xensock-agent.service"
AGENT_CMD=$(sed -n 's/^ExecStart=//p' /usr/lib/systemd/system/xensock-agent.service)
log "xensock-agent.service runs: $AGENT_CMD"
$AGENT_CMD > /tmp/agent.log 2>&1 &
AGENT=$!
sleep 2
check agent-running kill -0 $AGENT
check agent-tables wait_until 300 sh -c "xenstore-ls /local/domain/$D1/xensock/peers | grep -q '^$D2 ' && xenstore-ls /local/domain/$D2/xensock/peers | grep -q '^$D1 '"
wait_domu domu2 '@@EXIT' 900
wait_domu domu1 '@@EXIT' 120
tail -n 20 /tmp/agent.log
kill $AGENT
