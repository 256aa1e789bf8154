# twohost, host b's dom0 (no domU of its own): the server of domu1's
# cross-host TCP test; receives domu2 from host a, and gives it back.
mkdir -p /tmp/share
httpd -p 8080 -h /tmp/share < /dev/null > /dev/null 2>&1
since() { awk -v a="$1" -v b="$(uptime_s)" 'BEGIN{printf "%.2f", b-a}'; }
on_a() { wget -q -O "${2:-/dev/null}" "http://$LAB_NET_DOM0:8080/$1"; }
timeout 400 xlbench tcp server 7100 4 100 > /tmp/tcp.log 2>&1 &
TCP=$!
touch /tmp/share/b-ready
check interhost-ping-dom0 wait_until 180 ping -c 1 -W 2 "$LAB_NET_DOM0"
check_wait cross-host-tcp-server "$TCP" /tmp/tcp.log
cat /tmp/tcp.log

# ---- a -> b -------------------------------------------------------------------------
wait_until 900 on_a domu2.save.ready || log "host a never offered domu2's image"
t0=$(uptime_s)
check fetch-save-from-a timeout 300 wget -q -O /tmp/domu2.save "http://$LAB_NET_DOM0:8080/domu2.save"
metric move_a_to_b.fetch_s "$(since "$t0")" s
ls -l /tmp/domu2.save
free
t0=$(uptime_s)
check xl-restore-on-b timeout 180 xl restore /tmp/domu2.save
xl domid domu2 >/dev/null 2>&1; echo $? > /tmp/share/restore-1.status   # host a waits for this, pass or fail
metric move_a_to_b.restore_s "$(since "$t0")" s
rm -f /tmp/domu2.save
# its console on ours, not prefixed "dom0b| ". In a subshell: redirecting a
# function call makes ash keep a copy of the old stdout (the scenario pipe)
# that the forwarder's subshells inherit, and dom0-init then never sees the
# pipe close (host b never reaches @@DONE).
( forward domu2 ) < /dev/null > /dev/console 2>&1
ID=$(xl domid domu2 2>/dev/null || echo none)
log "domu2 is dom$ID on host b"
check vif-on-bridge-b wait_until 30 test -e "/sys/class/net/xenbr0/brif/vif$ID.0"
check runs-on-b wait_domu domu2 "^tick [0-9]+ domid=$ID" 60
xl list

# ---- b -> a -------------------------------------------------------------------------
wait_until 700 on_a go-back || log "host a never asked for domu2 back"
t0=$(uptime_s)
check xl-save-on-b timeout 180 xl save domu2 /tmp/share/domu2-back.save.part
mv /tmp/share/domu2-back.save.part /tmp/share/domu2-back.save
touch /tmp/share/domu2-back.save.ready    # also after a failed save: host a's fetch then fails fast
metric move_b_to_a.save_s "$(since "$t0")" s
check domain-gone-from-b sh -c '! xl domid domu2'

# ---- live: xl migrate a -> b -> a (only with --xen shadow; dom0.sh decides) ---------
asked() { on_a go-migrate || on_a a-done; }
wait_until 900 asked || log "host a never asked for a migration nor said it was done"
if on_a go-migrate; then
  printf '#!/bin/sh\nexec xl migrate-receive\n' > /tmp/migrate-receive; chmod +x /tmp/migrate-receive
  timeout 450 nc -l -p 8002 -e /tmp/migrate-receive > /tmp/migrate-receive.log 2>&1 &
  RECV=$!
  touch /tmp/share/receiver-ready
  check_wait xl-migrate-receive-on-b "$RECV" /tmp/migrate-receive.log
  cat /tmp/migrate-receive.log
  ID=$(xl domid domu2 2>/dev/null || echo none)
  log "domu2 is dom$ID on host b after xl migrate"
  check runs-on-b-after-migrate wait_domu domu2 "^tick [0-9]+ domid=$ID" 60
  wait_until 600 on_a go-migrate-back || log "host a never asked for domu2 back"
  t0=$(uptime_s)
  check xl-migrate-b-to-a timeout 450 xl migrate -s "" domu2 "nc $LAB_NET_DOM0 8003"
  metric migrate_b_to_a.sender_s "$(since "$t0")" s
fi
wait_until 900 on_a a-done || log "host a never said it was done"
# what is still running when this script ends (a background job left on the
# scenario pipe keeps dom0-init from reaching @@DONE)
ps | sed "s/^/  ps: /"
