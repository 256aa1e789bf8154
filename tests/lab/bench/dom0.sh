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
# issue #7's TCP carrier phase (domu2.sh): per round, the pair stops being
# co-resident when the client's connection is on the ring (the agent's
# part: both link directories removed, as in tests/lab/kmod-migrate), and
# is linked again once the round is over; domu2 starts the next round (and
# both domUs the module's later phases: rmmod) only after data/tcpc-linked-<round>
linked() {
  test "$(xenstore-read /local/domain/$D1/data/xensock/link/$D2/state 2>/dev/null)" = 4 &&
  test "$(xenstore-read /local/domain/$D2/data/xensock/link/$D1/state 2>/dev/null)" = 4
}
links_ok=0
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
if ! phase tcp-carrier; then :
elif [ $links_ok = 0 ]; then result tcp-carrier-links PASS
else result tcp-carrier-links FAIL "a round's link directories were not removed and made again"; fi
wait_domu domu1 'afxen-rmmod (PASS|FAIL)' 800
wait_domu domu2 'afxen-rmmod (PASS|FAIL)' 800
xenstore-ls /local/domain/$D1/data/xensock 2>&1 | head -n 20
/tmp/xenstore-rm /local/domain/$D1/data/xensock/link /local/domain/$D2/data/xensock/link
xenstore-write /local/domain/$D1/data/bench-user-go 1 /local/domain/$D2/data/bench-user-go 1
log "user-space phase: go"
