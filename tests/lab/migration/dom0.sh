# Migration scenarios, dom0: runs xensock-agent (the domUs' tables and link
# directories) and moves domu1 under the streams, one move per phase:
#   saverestore  xl save + xl restore (the operator first notes the domain as
#                moved, /tool/xensock/moved/<uuid>, so its peers hear "left",
#                not "destroyed")
#   away         xensock-agent away/back: domu1 stays, discovery says it left
#   migrate      xl migrate to localhost (needs lab/run --xen shadow)
#   bothsave     xl save of both domUs, then xl restore of both (both ends
#                of every connection move at once: host maintenance, as
#                xendomains does it); both are noted as moved first
#   churn        MIG_CHURN cycles of away + back under the same streams, each
#                cycle waiting until both domUs see their connections on TCP,
#                then back on rings (the "zero bytes lost over 100
#                moves", on real Xen)
# The domUs and dom0 take turns through data/lab/<key> nodes in each domU's
# home (see common.sh); dom0 writes into domu1's *current* home.
. /opt/xensock/migration.params
D1=$(xl domid domu1); D2=$(xl domid domu2)
UUID=$(xenstore-read "/local/domain/$D1/vm" | sed 's|.*/||')
UUID2=$(xenstore-read "/local/domain/$D2/vm" | sed 's|.*/||')
log "stack $MIG_STACK, moves: $MIG_MOVES; domu1 dom$D1 ($UUID), domu2 dom$D2"
since() { awk -v a="$1" -v b="$(uptime_s)" 'BEGIN{printf "%.2f", b-a}'; }
note() { xenstore-write "/local/domain/$1/data/lab/$2" "${3:-1}"; }
seen() { xenstore-read "/local/domain/$1/data/lab/$2" >/dev/null 2>&1; }
# domu1's stack (mixed: af_xen.ko in MIG_MIXED_KMOD, user space in the other)
D1_STACK=$MIG_STACK
if [ "$MIG_STACK" = mixed ]; then
  if [ "${MIG_MIXED_KMOD:-domu1}" = domu1 ]; then D1_STACK=kmod; else D1_STACK=userspace; fi
fi
hook() { [ "$D1_STACK" = userspace ] && [ "${MIG_HOOK:-1}" = 1 ]; }
# moves after which domu1 has the same domid (nothing suspended)
stays() { [ "$1" = away ] || [ "$1" = churn ]; }
both_seen() { seen "$D1" "$1" && seen "$D2" "$1"; }
# if xenstored dies (a guest's XenStore requests then hang for good): say so
xenstored_report() {
  if pidof xenstored >/dev/null; then log "xenstored runs"
  else log "xenstored is NOT running"; dmesg | grep -i -E "xenstored|segfault|trap" | tail -n 5; fi
}
# XS_TRANSACTION_START requests that xenstored refused, from its trace
# (dom0-init starts it with -T): Linux's xenbus counts a *user-space* one
# that fails twice on the way out (xs_request_exit, drivers/xen/xenbus/
# xenbus_xs.c), so its count of requests in flight wraps below zero and
# the guest's next suspend waits for it to reach zero for ever: "guest did
# not suspend, timed out" (docs/lab.md, "Guests that never suspend"; the
# lab kernel carries the fix, lab/kernel/patches). Each line: the
# connection, the domain its requests name, the reply.
xs_start_failures() {
  awk '$1 == "IN" { last[$2] = $5
                    if (match($0, /\/local\/domain\/[0-9]+/)) dom[$2] = substr($0, RSTART + 14, RLENGTH - 14) }
       $1 == "OUT" && $5 == "ERROR" && last[$2] == "TRANSACTION_START" {
         n++; if (n <= 20) print "  conn " $2 " (dom " dom[$2] "): " $0 }
       END { print "  " n + 0 " refused TRANSACTION_START in the trace" }' /var/log/xen/xenstored-trace.log 2>/dev/null
}
# After a save or migration that did not happen (domu1 still under its
# old domid): what the guest may be waiting for in its suspend path
# (xs_suspend waits until none of its XenStore requests is in flight):
# requests xenstored has not answered, per connection, with the domain
# they name and the last ones sent.
move_failed_report() {
  log "domu1 is still dom$D1 after $MOVE: its control node, then XenStore requests not answered"
  xenstore-ls "/local/domain/$D1/control" 2>&1 | sed 's/^/  [control] /'
  awk '$1 == "IN" { n[$2]++; lastin[$2] = $0
                    if (match($0, /\/local\/domain\/[0-9]+/)) dom[$2] = substr($0, RSTART + 14, RLENGTH - 14) }
       $1 == "OUT" && $5 != "WATCH_EVENT" { n[$2]-- }
       END { for (c in n) if (n[c] > 0) print "  [pending] conn " c " (dom " dom[c] "): " n[c] " unanswered, last sent: " lastin[c] }' \
    /var/log/xen/xenstored-trace.log 2>/dev/null
  xs_start_failures
}
await() { wait_until "$2" both_seen "$1" || { log "not both domUs reported $1 within $2 s (d1 $(seen "$D1" "$1" && echo y), d2 $(seen "$D2" "$1" && echo y))"; xenstored_report; }; }
lists() { xenstore-ls "/local/domain/$1/xensock/peers" 2>/dev/null | grep -q "^$2 "; }
linked() { xenstore-read "/local/domain/$1/data/xensock/link/$2" >/dev/null 2>&1; }
pair_linked() { linked "$1" "$2" && linked "$2" "$1"; }
pair_unlinked() { ! linked "$1" "$2" && ! linked "$2" "$1"; }
# churn: both domUs acknowledged STEP (data/lab/churn-ack), or one noted
# churn-failed. One node each way whose value moves on, not a node per
# cycle: a XenStore directory's list of children is capped (2048 bytes by
# default), and the domUs' writes failed at cycle 37
acked() { [ "$(xenstore-read "/local/domain/$1/data/lab/churn-ack" 2>/dev/null)" = "$2" ]; }
churn_step() { { acked "$D1" "$1" && acked "$D2" "$1"; } || churn_failed; }
churn_failed() { seen "$D1" churn-failed || seen "$D2" churn-failed; }

start_agent
check agent-tables wait_until 300 sh -c "xenstore-ls /local/domain/$D1/xensock/peers | grep -q '^$D2 ' && xenstore-ls /local/domain/$D2/xensock/peers | grep -q '^$D1 '"
check agent-link-dirs wait_until 60 pair_linked "$D1" "$D2"
xenstore-ls -p "/local/domain/$D1/data/xensock" | sed 's/^/  [d1] /'

for MOVE in $MIG_MOVES; do
  echo "@@PHASE $MOVE-start up=$(uptime_s)"
  wait_until 300 seen "$D1" "$MOVE-listening" || log "domu1 never listened for $MOVE"
  note "$D2" "$MOVE-go" "$D1"
  await "$MOVE-flowing" 600
  sleep 3
  # the user-space transport's hook before the move (see common.sh)
  if hook && ! stays "$MOVE"; then
    note "$D1" "$MOVE-suspend"
    [ "$MOVE" = bothsave ] && note "$D2" "$MOVE-suspend"
    wait_until 120 seen "$D1" "$MOVE-suspended" || log "domu1 never ran its suspend hook for $MOVE"
    if [ "$MOVE" = bothsave ]; then
      wait_until 120 seen "$D2" "$MOVE-suspended" || log "domu2 never ran its suspend hook for $MOVE"
    fi
  fi
  DOWN=0
  log "before $MOVE: $(xs_start_failures | tail -n 1)"
  xs_start_failures | sed '$d'
  case $MOVE in
    saverestore)
      xenstore-write "/tool/xensock/moved/$UUID" lab-a
      t0=$(uptime_s)
      check xl-save timeout 300 xl save domu1 /tmp/domu1.save
      [ "$(xl domid domu1 2>/dev/null)" = "$D1" ] && move_failed_report
      metric saverestore.save_s "$(since "$t0")" s
      t1=$(uptime_s)
      check xl-restore timeout 300 xl restore /tmp/domu1.save
      metric saverestore.restore_s "$(since "$t1")" s
      metric saverestore.total_s "$(since "$t0")" s
      DOWN=$(since "$t0")
      rm -f /tmp/domu1.save
      xenstore-rm "/tool/xensock/moved/$UUID" ;;
    bothsave)
      xenstore-write "/tool/xensock/moved/$UUID" lab-a
      xenstore-write "/tool/xensock/moved/$UUID2" lab-a
      t0=$(uptime_s)
      check xl-save-both sh -c "timeout 300 xl save domu1 /tmp/domu1.save && timeout 300 xl save domu2 /tmp/domu2.save"
      metric bothsave.save_s "$(since "$t0")" s
      t1=$(uptime_s)
      check xl-restore-both sh -c "timeout 300 xl restore /tmp/domu1.save && timeout 300 xl restore /tmp/domu2.save"
      metric bothsave.restore_s "$(since "$t1")" s
      metric bothsave.total_s "$(since "$t0")" s
      DOWN=$(since "$t0")
      rm -f /tmp/domu1.save /tmp/domu2.save
      xenstore-rm "/tool/xensock/moved/$UUID"
      xenstore-rm "/tool/xensock/moved/$UUID2"
      NEW2=$(xl domid domu2 2>/dev/null || echo none)
      log "bothsave: domu2 dom$D2 -> dom$NEW2"
      check bothsave-new-domid2 test "$NEW2" != none -a "$NEW2" != "$D2"
      [ "$NEW2" != none ] && D2=$NEW2 ;;
    migrate)
      if [ "$(cat /lab/xen-flavour 2>/dev/null)" != shadow ]; then
        result xl-migrate FAIL "Debian's Xen has no shadow paging for log-dirty: lab/run --xen shadow <scenario>"
      else
        t0=$(uptime_s)
        check xl-migrate timeout 600 xl migrate -s "" domu1 "xl migrate-receive"
        [ "$(xl domid domu1 2>/dev/null)" = "$D1" ] && move_failed_report
        metric migrate.migrate_s "$(since "$t0")" s
        DOWN=$(since "$t0")
      fi ;;
    away)
      t0=$(uptime_s)
      check agent-away xensock-agent away "$D1" host-b
      check away-tables wait_until 30 sh -c "! xenstore-ls /local/domain/$D2/xensock/peers | grep -q '^$D1 ' && ! xenstore-ls /local/domain/$D1/xensock/peers | grep -q '^$D2 '"
      check away-link-dirs-gone wait_until 30 pair_unlinked "$D1" "$D2"
      check away-moved-noted sh -c "test \"\$(xenstore-read /local/domain/$D2/xensock/moved/$UUID)\" = host-b"
      note "$D1" away-marked; note "$D2" away-marked
      # a key of its own: with "away-checked" for both this and the end of
      # the phase, dom0 stopped the streams after `back` while domu2 was
      # still checking them
      await away-while-checked 900
      metric away.away_s "$(since "$t0")" s
      t0=$(uptime_s)
      check agent-back xensock-agent back "$D1"
      check back-tables wait_until 30 sh -c "xenstore-ls /local/domain/$D2/xensock/peers | grep -q '^$D1 ' && xenstore-ls /local/domain/$D1/xensock/peers | grep -q '^$D2 '"
      check back-link-dirs wait_until 30 pair_linked "$D1" "$D2"
      note "$D1" away-back; note "$D2" away-back ;;
    churn)
      # one check for the whole run; a cycle that fails ends the loop (the
      # domUs say which of their checks failed and why)
      done_n=0; why=
      t0=$(uptime_s)
      i=1
      while [ "$i" -le "$MIG_CHURN" ]; do
        xensock-agent away "$D1" host-b >> /tmp/churn-agent.log 2>&1 || { why="agent away failed at cycle $i"; break; }
        note "$D1" churn "away-$i"; note "$D2" churn "away-$i"
        wait_until 120 churn_step "tcp-$i" || { why="cycle $i: not both domUs on TCP within 120 s"; break; }
        churn_failed && { why="cycle $i: a domU gave up"; break; }
        xensock-agent back "$D1" >> /tmp/churn-agent.log 2>&1 || { why="agent back failed at cycle $i"; break; }
        note "$D1" churn "back-$i"; note "$D2" churn "back-$i"
        wait_until 120 churn_step "ring-$i" || { why="cycle $i: not both domUs back on rings within 120 s"; break; }
        churn_failed && { why="cycle $i: a domU gave up"; break; }
        done_n=$i
        [ $((i % 10)) = 0 ] && log "churn: $i of $MIG_CHURN cycles, $(since "$t0") s"
        i=$((i + 1))
      done
      metric churn.cycles "$done_n" n
      metric churn.total_s "$(since "$t0")" s
      # the domUs stop waiting for cycles that will not come
      note "$D1" churn-end "$done_n"; note "$D2" churn-end "$done_n"
      if [ "$done_n" = "$MIG_CHURN" ]; then result churn-cycles PASS "$done_n away/back cycles in $(since "$t0") s"
      else result churn-cycles FAIL "$done_n of $MIG_CHURN cycles: $why"; tail -n 20 /tmp/churn-agent.log; fi ;;
  esac
  NEW=$(xl domid domu1 2>/dev/null || echo none)
  # the guest's own downtime, for the streams' added-pause metrics
  [ "$NEW" != none ] && note "$NEW" "$MOVE-downtime" "$DOWN"
  note "$D2" "$MOVE-downtime" "$DOWN"
  if hook && ! stays "$MOVE" && [ "$NEW" != none ]; then
    note "$NEW" "$MOVE-resume"
    [ "$MOVE" = bothsave ] && note "$D2" "$MOVE-resume"
    wait_until 120 seen "$NEW" "$MOVE-resumed" || log "domu1 never ran its resume hook for $MOVE"
    if [ "$MOVE" = bothsave ]; then
      wait_until 120 seen "$D2" "$MOVE-resumed" || log "domu2 never ran its resume hook for $MOVE"
    fi
  fi
  if ! stays "$MOVE"; then
    log "$MOVE: domu1 dom$D1 -> dom$NEW"
    check "$MOVE-new-domid" test "$NEW" != none -a "$NEW" != "$D1"
    [ "$NEW" != none ] && D1=$NEW
    check "$MOVE-tables-again" wait_until 120 sh -c "xenstore-ls /local/domain/$D2/xensock/peers | grep -q '^$D1 '"
    check "$MOVE-link-dirs-again" wait_until 60 pair_linked "$D1" "$D2"
    note "$D1" "$MOVE-moved" "$D1"; note "$D2" "$MOVE-moved" "$D1"
  fi
  await "$MOVE-checked" 900
  note "$D1" "$MOVE-stop"; note "$D2" "$MOVE-stop"
  await "$MOVE-done" 600
  echo "@@PHASE $MOVE-done up=$(uptime_s)"
done
xl list
xenstored_report
tail -n 30 /tmp/agent.log
kill $AGENT
