# saverestore, dom0 side: save domu1 to a file, restore it, and check that it
# came back as a new domain that still runs its scenario and is on the bridge.
OLD=$(xl domid domu1)
D2=$(xl domid domu2)
wait_domu domu1 '^tick 3 ' 120 || log "domu1 never started ticking"
t0=$(uptime_s)
check xl-save timeout 180 xl save domu1 /tmp/domu1.save
t1=$(uptime_s)
ls -l /tmp/domu1.save
metric saverestore.save_s "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')" s
check domain-gone-after-save sh -c '! xl domid domu1'
check xl-restore timeout 180 xl restore /tmp/domu1.save
t2=$(uptime_s)
metric saverestore.restore_s "$(awk -v a="$t1" -v b="$t2" 'BEGIN{print b-a}')" s
rm -f /tmp/domu1.save
NEW=$(xl domid domu1 2>/dev/null || echo none)
log "domu1: domid $OLD before save, $NEW after restore"
check new-domid test "$NEW" != none -a "$NEW" != "$OLD"
check runs-after-restore wait_domu domu1 "^tick [0-9]+ domid=$NEW" 60
check vif-on-bridge-after-restore wait_until 30 test -e "/sys/class/net/xenbr0/brif/vif$NEW.0"
check ping-after-restore wait_until 60 ping -c 1 -W 2 "$LAB_NET_DOMU1"
xl list
# let both domUs finish their side
xenstore-write "/local/domain/$NEW/data/lab-moved" 1 "/local/domain/$D2/data/lab-moved" 1
