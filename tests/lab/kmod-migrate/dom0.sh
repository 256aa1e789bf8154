# kmod-migrate, dom0 side: the link directories for the two domUs, as in
# mklink of lab/guest/lib.sh (stand-in for the discovery agent); then, for the
# move test, the pair stops being co-resident (both link directories
# removed, as the agent does when a pair ends) and becomes co-resident
# again (made again), each when domu2's client says so.
D1=$(xl domid domu1); D2=$(xl domid domu2)
log "link directories: dom$D1 <-> dom$D2"
linked() {
  test "$(xenstore-read /local/domain/$D1/data/xensock/link/$D2/state 2>/dev/null)" = 4 &&
  test "$(xenstore-read /local/domain/$D2/data/xensock/link/$D1/state 2>/dev/null)" = 4
}
pair_again() { mklink "$D1" "$D2" && mklink "$D2" "$D1"; }
# linked_within S: the link up within S seconds; if not, both halves as
# XenStore has them (which side never wrote, or never went to state 4)
linked_within() {
  wait_until "$1" linked && return 0
  xenstore-ls -f "/local/domain/$D1/data/xensock/link/$D2" 2>&1 | sed 's/^/  [link] /'
  xenstore-ls -f "/local/domain/$D2/data/xensock/link/$D1" 2>&1 | sed 's/^/  [link] /'
  return 1
}
pair_ended() {
  xenstore-rm "/local/domain/$D1/data/xensock/link/$D2" &&
  xenstore-rm "/local/domain/$D2/data/xensock/link/$D1"
}
mklink "$D1" "$D2" && mklink "$D2" "$D1"
check xs-link-connected linked_within 240
# the move test (agent-told)
# (each wait also ends when domu2's script ended without asking)
if wait_domu domu2 'm-phase ring-ok|^@@EXIT' 600 && ! wait_domu domu2 '^@@EXIT' 0; then
  check xs-pair-ended pair_ended
  if wait_domu domu2 'm-phase tcp-ok|^@@EXIT' 300 && ! wait_domu domu2 '^@@EXIT' 0; then
    check xs-pair-again pair_again
    check xs-link-connected-again linked_within 60
    xenstore-ls -p "/local/domain/$D1/data/xensock" "/local/domain/$D2/data/xensock" 2>&1 | head -n 20
    xenstore-ls -p "/local/domain/$D1/data/xensock" 2>&1 | head -n 12
    xenstore-ls -p "/local/domain/$D2/data/xensock" 2>&1 | head -n 12
  else
    log "domu2 never reported streaming on TCP"
  fi
else
  log "domu2 never reported the ring phase"
fi
# the save test: domu1 is saved and restored mid-stream (a new domid); the
# agent's part: the pair with the old domid ended, the new pair is linked
if wait_domu domu2 'm-phase save-now|^@@EXIT' 900 && ! wait_domu domu2 '^@@EXIT' 0; then
  OLD=$D1
  check xl-save-domu1 timeout 180 xl save domu1 /tmp/domu1.save
  restore_as_new domu1 "$OLD" "$D2"
  D1=$NEW_DOMID
  check xs-pair-after-restore pair_again
  check xs-link-connected-after-restore linked_within 60
  xenstore-write "/local/domain/$D2/data/peer-now" "$D1"
  xenstore-ls "/local/domain/$D2/data/xensock" 2>/dev/null
else
  log "domu2 never asked for the save"
fi
# the close-first test: the pair ends under a connection (it goes to TCP),
# the server closes first; linked again afterwards for the death test
if wait_domu domu2 'm-phase cf-ring-ok|^@@EXIT' 600 && ! wait_domu domu2 '^@@EXIT' 0; then
  check xs-pair-ended-cf pair_ended
  if wait_domu domu2 'm-phase cf-done|^@@EXIT' 400 && ! wait_domu domu2 '^@@EXIT' 0; then
    check xs-pair-again-cf pair_again
    check xs-link-connected-cf linked_within 60
  else
    log "domu2's close-first test never finished"
  fi
else
  log "domu2's close-first test never reported the ring phase"
fi
# the death test: domu1 streams with domu2's victim; the pair ends (the
# connection goes to TCP), then domu2 is destroyed: domu1's connection
# must reset within its peer_lost_ms (a leg left unanswered)
if wait_domu domu1 'm-phase dead-ring-ok|^@@EXIT' 900 && ! wait_domu domu1 '^@@EXIT' 0; then
  check xs-pair-ended-dead pair_ended
  if wait_domu domu1 'm-phase dead-tcp-ok|^@@EXIT' 120 && ! wait_domu domu1 '^@@EXIT' 0; then
    # domu2's script has ended (its victim outlives it): destroyed before
    # its @@EXIT reached the console, the run waited for that line until
    # the guest timeout
    wait_domu domu2 '^@@EXIT' 60 || log "domu2's script never reported its end"
    check xl-destroy-domu2 xl destroy domu2
  else
    log "domu1's death test never reported TCP"
  fi
else
  log "domu1's death test never reported the ring phase"
fi
