# twohost, host a's dom0: moves domu2 to host b and back while domu1 streams
# to it. The two dom0s coordinate through files served by busybox httpd on
# port 8080 (/tmp/share): the save images travel the same way, over the
# inter-host network.
D1=$(xl domid domu1)
mkdir -p /tmp/share
httpd -p 8080 -h /tmp/share < /dev/null > /dev/null 2>&1
since() { awk -v a="$1" -v b="$(uptime_s)" 'BEGIN{printf "%.2f", b-a}'; }
on_b() { wget -q -O "${2:-/dev/null}" "http://$LAB_NET_DOM0B:8080/$1"; }
D2=$(xl domid domu2)
UUID2=$(xenstore-read "/local/domain/$D2/vm" | sed 's|.*/||')
# our XenStore client (agent, away/back) talks to xenstored's socket
XENSTORED_PATH=/run/xenstored/socket
[ -S $XENSTORED_PATH ] || XENSTORED_PATH=/var/run/xenstored/socket
export XENSTORED_PATH
# the discovery agent: the domUs' tables and link directories (AF_XEN)
xensock-agent --host-name host-a > /tmp/agent.log 2>&1 &
check agent-link-dirs wait_until 300 sh -c "xenstore-read /local/domain/$D1/data/xensock/link/$D2 && xenstore-read /local/domain/$D2/data/xensock/link/$D1"
note1() { xenstore-write "/local/domain/$D1/data/lab/$1" "${2:-1}"; }
seen1() { xenstore-read "/local/domain/$D1/data/lab/$1" >/dev/null 2>&1; }
if [ "$(cat /lab/xen-flavour 2>/dev/null)" = shadow ]; then note1 live yes; else note1 live no; fi
check interhost-ping-dom0b wait_until 180 ping -c 1 -W 2 "$LAB_NET_DOM0B"
check hostb-ready wait_until 240 on_b b-ready
ls /sys/class/net/xenbr0/brif
check stream-started wait_until 300 xenstore-read "/local/domain/$D1/data/stream-started"
sleep 3

# ---- a -> b -------------------------------------------------------------------------
echo "@@PHASE moves-start up=$(uptime_s)"
t0=$(uptime_s)
# the operator's note (docs/discovery.md): domu2's peers hear it left
xenstore-write "/tool/xensock/moved/$UUID2" host-b
check xl-save-on-a timeout 180 xl save domu2 /tmp/share/domu2.save.part
ls -l /tmp/share
mv /tmp/share/domu2.save.part /tmp/share/domu2.save && touch /tmp/share/domu2.save.ready
metric move_a_to_b.save_s "$(since "$t0")" s
check domain-gone-from-a sh -c '! xl domid domu2'
wait_until 400 on_b restore-1.status || log "host b never said how its xl restore went"
check restored-on-b test "$(wget -q -O - "http://$LAB_NET_DOM0B:8080/restore-1.status")" = 0
metric move_a_to_b.total_s "$(since "$t0")" s
rm -f /tmp/share/domu2.save /tmp/share/domu2.save.ready
check ping-domu2-on-b wait_until 60 ping -c 1 -W 2 "$LAB_NET_DOMU2"
note1 on-b
wait_until 400 seen1 on-b-checked || log "domu1 never finished its checks with domu2 on b"

# ---- b -> a -------------------------------------------------------------------------
t0=$(uptime_s)
touch /tmp/share/go-back
check hostb-saved wait_until 400 on_b domu2-back.save.ready
t1=$(uptime_s)
check fetch-save-from-b timeout 300 wget -q -O /tmp/domu2-back.save "http://$LAB_NET_DOM0B:8080/domu2-back.save"
metric move_b_to_a.fetch_s "$(since "$t1")" s
ls -l /tmp/domu2-back.save
t1=$(uptime_s)
check xl-restore-on-a timeout 180 xl restore /tmp/domu2-back.save
metric move_b_to_a.restore_s "$(since "$t1")" s
metric move_b_to_a.total_s "$(since "$t0")" s
rm -f /tmp/domu2-back.save
NEW=$(xl domid domu2 2>/dev/null || echo none)
log "domu2 is dom$NEW on host a again"
check new-domid test "$NEW" != none
check vif-on-bridge-after-return wait_until 30 test -e "/sys/class/net/xenbr0/brif/vif$NEW.0"
check ping-domu2-after-return wait_until 60 ping -c 1 -W 2 "$LAB_NET_DOMU2"
xenstore-rm "/tool/xensock/moved/$UUID2"
check agent-link-dirs-after-return wait_until 120 sh -c "xenstore-read /local/domain/$D1/data/xensock/link/$NEW && xenstore-read /local/domain/$NEW/data/xensock/link/$D1"
note1 back-on-a
wait_until 400 seen1 back-checked || log "domu1 never finished its checks with domu2 back"

# ---- live: xl migrate a -> b -> a (needs log-dirty: lab/run --xen shadow twohost) ---
# xl migrate -s "" runs its "host" argument as the channel to the receiver:
# here nc to the other dom0, whose nc runs `xl migrate-receive`.
if [ "$(cat /lab/xen-flavour 2>/dev/null)" = shadow ]; then
  printf '#!/bin/sh\nexec xl migrate-receive\n' > /tmp/migrate-receive; chmod +x /tmp/migrate-receive
  touch /tmp/share/go-migrate
  check hostb-receiving wait_until 300 on_b receiver-ready
  t0=$(uptime_s)
  xenstore-write "/tool/xensock/moved/$UUID2" host-b
  check xl-migrate-a-to-b timeout 450 xl migrate -s "" domu2 "nc $LAB_NET_DOM0B 8002"
  metric migrate_a_to_b.total_s "$(since "$t0")" s
  check gone-from-a-after-migrate sh -c '! xl domid domu2'
  check ping-domu2-migrated-to-b wait_until 60 ping -c 1 -W 2 "$LAB_NET_DOMU2"
  note1 migrated-to-b
  wait_until 300 seen1 migrated-to-b-checked || log "domu1 never checked the streams with domu2 migrated to b"
  sleep 3
  timeout 450 nc -l -p 8003 -e /tmp/migrate-receive > /tmp/migrate-receive.log 2>&1 &
  RECV=$!
  t0=$(uptime_s)
  touch /tmp/share/go-migrate-back
  check_wait xl-migrate-receive-on-a "$RECV" /tmp/migrate-receive.log
  metric migrate_b_to_a.total_s "$(since "$t0")" s
  cat /tmp/migrate-receive.log
  NEW=$(xl domid domu2 2>/dev/null || echo none)
  log "domu2 is dom$NEW on host a after migrating back"
  check vif-on-bridge-after-migrate-back wait_until 30 test -e "/sys/class/net/xenbr0/brif/vif$NEW.0"
  check ping-domu2-after-migrate-back wait_until 60 ping -c 1 -W 2 "$LAB_NET_DOMU2"
  xenstore-rm "/tool/xensock/moved/$UUID2"
  note1 migrated-back
  wait_until 300 seen1 migrated-back-checked || log "domu1 never checked the streams with domu2 migrated back"
else
  result xl-migrate-a-to-b SKIP "Debian's Xen has no shadow paging for log-dirty: lab/run --xen shadow twohost"
fi
echo "@@PHASE moves-done up=$(uptime_s)"
xl list
xenstore-write "/local/domain/$D1/data/lab-stop" 1 "/local/domain/$NEW/data/lab-done" 1
touch /tmp/share/a-done
