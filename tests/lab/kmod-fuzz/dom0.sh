# kmod-fuzz, dom0: xensock-agent keeps the domUs' tables and link
# directories; while the domUs fuzz, dom0 moves them in turn, one move every
# 40 s until 100 s before the fuzzers' end: domu1 saved and restored under a
# new domid (noted as moved first, so its peer hears "left"), domu2 away and
# back (the agent says it left the host and came back), domu2 saved and
# restored, domu1 away and back. With FUZZ_DEATH=1, domu2 is then destroyed
# without a note while both still fuzz: domu1's connections to it lose their
# peer mid-call, and domu1 fuzzes on against a domid that is gone.
. /opt/xensock/fuzz.env
D1=$(xl domid domu1); D2=$(xl domid domu2)
start_agent
linked() { [ "$(xenstore-read "/local/domain/$1/data/xensock/link/$2/state" 2>/dev/null)" = 4 ]; }
pair_linked() { linked "$1" "$2" && linked "$2" "$1"; }
check agent-link-dirs wait_until 300 pair_linked "$D1" "$D2"
[ "$FUZZ_MOVES" = 0 ] && [ "$FUZZ_DEATH" = 0 ] && return 0
t0=$(cut -d' ' -f1 /proc/uptime | cut -d. -f1)
left() { echo $((FUZZ_SECONDS - ($(cut -d' ' -f1 /proc/uptime | cut -d. -f1) - t0))); }
# save_restore DOMU: xl save + xl restore; the peer's data/peer gets the
# new domid (the fuzzer connects to it)
save_restore() {
  _d=$1 _old=$(xl domid "$1") _o=domu2; [ "$1" = domu2 ] && _o=domu1
  _od=$(xl domid $_o) _uuid=$(xenstore-read "/local/domain/$_old/vm" | sed 's|.*/||')
  xenstore-write "/tool/xensock/moved/$_uuid" lab-a
  if timeout 300 xl save "$_d" /tmp/$_d.save > /tmp/save.log 2>&1 && timeout 300 xl restore /tmp/$_d.save >> /tmp/save.log 2>&1; then
    _new=$(xl domid "$_d")
    xenstore-write "/local/domain/$_new/data/peer" "$_od" "/local/domain/$_od/data/peer" "$_new"
    log "$_d saved and restored: dom$_old -> dom$_new"; _rc=0
  else
    log "$_d: save/restore failed"; tail -n 10 /tmp/save.log; _rc=1
  fi
  rm -f /tmp/$_d.save; xenstore-rm "/tool/xensock/moved/$_uuid"
  return $_rc
}
# away_back DOMU: the agent says DOMU left for another host, 15 s later
# that it is back
away_back() {
  _id=$(xl domid "$1")
  xensock-agent away "$_id" host-b >> /tmp/agent-moves.log 2>&1 || { log "$1: agent away failed"; return 1; }
  lab_sleep 15
  xensock-agent back "$_id" >> /tmp/agent-moves.log 2>&1 || { log "$1: agent back failed"; return 1; }
  log "$1 away and back"
}
moves=0 failed=0
if [ "$FUZZ_MOVES" = 1 ]; then
  while [ $failed = 0 ]; do
    for m in "save_restore domu1" "away_back domu2" "save_restore domu2" "away_back domu1"; do
      lab_sleep 40
      [ "$(left)" -gt 100 ] || break 2
      if $m; then moves=$((moves + 1)); else failed=$((failed + 1)); break 2; fi
    done
  done
  if [ $failed = 0 ] && [ $moves -gt 0 ]; then result fuzz-moves PASS "$moves moves (save+restore, away+back)"
  else result fuzz-moves FAIL "$moves moves, $failed failed"; tail -n 20 /tmp/agent.log; fi
fi
if [ "$FUZZ_DEATH" = 1 ]; then
  while [ "$(left)" -gt 90 ]; do lab_sleep 5; done
  D1=$(xl domid domu1); D2=$(xl domid domu2)
  log "destroying domu2 (dom$D2) with $(left) s of fuzzing left"
  touch /tmp/destroyed.domu2
  check fuzz-peer-destroyed xl destroy domu2
  check fuzz-peer-gone-noted wait_until 30 xenstore-read "/local/domain/$D1/xensock/gone/$D2"
fi
