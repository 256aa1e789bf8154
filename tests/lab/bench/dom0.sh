# bench, dom0: the link directories af_xen.ko needs (standing in for the
# discovery agent: mklink of lab/guest/lib.sh), and the switch from the
# kernel family to the user-space transport: both own a domain's
# data/xensock/link, so the user-space phase starts only after both
# domUs unloaded the module and the directories are gone.
. /scenario/params.sh
D1=$(xl domid domu1); D2=$(xl domid domu2)
# the xenstore tools are one binary that dispatches on its name
ln -sf /usr/bin/xenstore-write /tmp/xenstore-rm
wait_domu domu1 'afxen-insmod (PASS|FAIL)' 120
wait_domu domu2 'afxen-insmod (PASS|FAIL)' 120
mklink "$D1" "$D2" && mklink "$D2" "$D1"
# (BENCH_ONLY=user: the domUs unload the module at once, nothing links)
[ "$BENCH_ONLY" = user ] ||
check xs-link-connected wait_until 240 sh -c "test \"\$(xenstore-read /local/domain/$D1/data/xensock/link/$D2/state)\" = 4 && test \"\$(xenstore-read /local/domain/$D2/data/xensock/link/$D1/state)\" = 4"
# the TCP carrier phase (domu2.sh): per round, the pair stops being
# co-resident when the client's connection is on the ring (the agent's
# part: both link directories removed, as in tests/lab/kmod-migrate), and
# is linked again once the round is over; domu2 starts the next round (and
# both domUs the module's later phases: rmmod) only after data/tcpc-linked-<round>
linked() {
  test "$(xenstore-read /local/domain/$D1/data/xensock/link/$D2/state 2>/dev/null)" = 4 &&
  test "$(xenstore-read /local/domain/$D2/data/xensock/link/$D1/state 2>/dev/null)" = 4
}
links_ok=0
# BENCH_DOMCPU (params.sh): each domain's CPU time per row of the phase
# and where dom0's own time goes over the phase: its /proc/stat and the
# processes and kernel threads (netback's among them) that took the most
DOMCPU_PID=
# proc_ticks FILE: "pid name ticks" of every task now: user + system time,
# its own and its reaped children's (the scripts' short-lived polls count
# in the shell that ran them). One cat and one awk: an awk per task cost
# dom0 seconds per snapshot under TCG (a task gone meanwhile is skipped).
proc_ticks() {
  cat /proc/[0-9]*/stat 2> /dev/null |
    awk '{ n = $2; i = 3; while (n !~ /\)$/) n = n " " $(i++); print $1, n, $(i + 11) + $(i + 12) + $(i + 13) + $(i + 14) }' > "$1"
}
if phase tcp-carrier && [ -n "$BENCH_DOMCPU" ]; then
  xlbench domcpu "/local/domain/$D2/data/bench-row" > /tmp/domcpu.txt 2>&1 &
  DOMCPU_PID=$!
  proc_ticks /tmp/ticks-before; head -n 1 /proc/stat > /tmp/stat-before
  if [ -f /var/log/xen/xenstored-trace.log ]; then wc -l < /var/log/xen/xenstored-trace.log; else echo 0; fi > /tmp/xstrace-before
fi
phase tcp-carrier &&
for ROUND in $(seq "$BENCH_REPS"); do
  # (each wait also ends when domu2's script ended without getting there)
  if ! wait_domu domu2 "switch-note tcpc-$ROUND (ring-ok|end)|^@@EXIT" 900 || wait_domu domu2 '^@@EXIT' 0; then
    log "tcpc-$ROUND: domu2 never got to the round"; links_ok=1; break
  fi
  if wait_domu domu2 "switch-note tcpc-$ROUND ring-ok" 0; then
    /tmp/xenstore-rm "/local/domain/$D1/data/xensock/link/$D2" "/local/domain/$D2/data/xensock/link/$D1" ||
      links_ok=1
    log "tcpc-$ROUND: link directories removed"
  else links_ok=1; fi
  wait_domu domu2 "switch-note tcpc-$ROUND end|^@@EXIT" 400 || links_ok=1
  { mklink "$D1" "$D2" && mklink "$D2" "$D1" && wait_until 60 linked; } || links_ok=1
  log "tcpc-$ROUND: linked again (rc $links_ok so far)"
  xenstore-write "/local/domain/$D1/data/tcpc-linked-$ROUND" 1 "/local/domain/$D2/data/tcpc-linked-$ROUND" 1
done
if [ -n "$DOMCPU_PID" ]; then
  # domu2 writes "done" after its last round; a watcher still there 60 s on
  # never heard it
  wait_until 60 sh -c "! kill -0 $DOMCPU_PID 2> /dev/null" || kill "$DOMCPU_PID" 2> /dev/null
  sed 's/^/  /' /tmp/domcpu.txt
  proc_ticks /tmp/ticks-after
  log "dom0 over the phase (ticks of 10 ms): $(head -n 1 /proc/stat | awk -v b="$(cat /tmp/stat-before)" '
    { split(b, o, " "); split("user nice system idle iowait irq softirq steal", k, " ")
      for (i = 1; i <= 8; i++) printf "%s %d ", k[i], $(i + 1) - o[i + 1] }')"
  awk 'NR == FNR { t[$1] = $NF; next }
    { d = $NF - (($1 in t) ? t[$1] : 0); if (d > 0) { $NF = ""; print d, $0 } }' \
    /tmp/ticks-before /tmp/ticks-after | sort -rn | head -n 15 | sed 's/^/  dom0 task ticks: /'
  # xenstored's requests over the phase (its trace, with LAB_XS_TRACE=1):
  # by connection, request and path with the numbers taken out
  if [ -f /var/log/xen/xenstored-trace.log ]; then
    tail -n +"$(( $(cat /tmp/xstrace-before) + 1 ))" /var/log/xen/xenstored-trace.log |
      awk '$1 == "IN" { p = $6; sub(/^\(/, "", p); gsub(/[0-9]+/, "N", p); n[$2 " " $5 " " p]++; all++ }
        END { for (k in n) print n[k], k; print all + 0, "requests in all" }' |
      sort -rn | head -n 20 | sed 's/^/  xenstored requests: /'
  fi
fi
if ! phase tcp-carrier; then :
elif [ $links_ok = 0 ]; then result tcp-carrier-links PASS
else result tcp-carrier-links FAIL "a round's link directories were not removed and made again"; fi
wait_domu domu1 'afxen-rmmod (PASS|FAIL)' 800
wait_domu domu2 'afxen-rmmod (PASS|FAIL)' 800
xenstore-ls /local/domain/$D1/data/xensock 2>&1 | head -n 20
/tmp/xenstore-rm /local/domain/$D1/data/xensock/link /local/domain/$D2/data/xensock/link
xenstore-write /local/domain/$D1/data/bench-user-go 1 /local/domain/$D2/data/bench-user-go 1
log "user-space phase: go"
