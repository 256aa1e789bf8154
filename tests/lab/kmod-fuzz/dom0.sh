# kmod-fuzz, dom0: the domUs' link directories (as the agent makes them),
# then, while the domUs fuzz, each domU in turn saved and restored under a
# new domid (its connections move or end mid-call), until 60 s before the
# fuzzers' end.
. /opt/xensock/fuzz.env
D1=$(xl domid domu1); D2=$(xl domid domu2)
mklink "$D1" "$D2" && mklink "$D2" "$D1"
[ "$FUZZ_MOVES" = 0 ] && return 0
t0=$(cut -d' ' -f1 /proc/uptime | cut -d. -f1)
moves=0 failed=0
while :; do
  for d in domu1 domu2; do
    lab_sleep 40
    now=$(cut -d' ' -f1 /proc/uptime | cut -d. -f1)
    [ $((now - t0)) -lt $((FUZZ_SECONDS - 60)) ] || break 2
    old=$(xl domid $d); other=domu2; [ $d = domu2 ] && other=domu1
    od=$(xl domid $other)
    if timeout 300 xl save $d /tmp/$d.save >/tmp/save.log 2>&1 && timeout 300 xl restore /tmp/$d.save >>/tmp/save.log 2>&1; then
      rm -f /tmp/$d.save
      new=$(xl domid $d)
      xenstore-rm "/local/domain/$od/data/xensock/link/$old" 2>/dev/null
      xenstore-write "/local/domain/$new/data/peer" "$od" "/local/domain/$od/data/peer" "$new"
      mklink "$new" "$od" && mklink "$od" "$new"
      moves=$((moves + 1))
      log "$d saved and restored: dom$old -> dom$new"
    else
      failed=$((failed + 1)); rm -f /tmp/$d.save
      log "$d: save/restore failed"; tail -n 10 /tmp/save.log
      break 2
    fi
  done
done
if [ $failed = 0 ] && [ $moves -gt 0 ]; then result fuzz-moves PASS "$moves save+restore moves"
else result fuzz-moves FAIL "$moves moves, $failed failed"; fi
