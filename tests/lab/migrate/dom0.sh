# migrate, dom0 side: live-migrate domu1 to this same host ("-s ''" runs the
# receiver locally instead of over ssh) and check it came back as a new
# domain that still runs and is on the bridge.
OLD=$(xl domid domu1)
D2=$(xl domid domu2)
wait_domu domu1 '^tick 3 ' 120 || log "domu1 never started ticking"
xl info | grep -E 'free_memory|xen_version'
t0=$(uptime_s)
check xl-migrate-localhost timeout 300 xl migrate -s "" domu1 "xl migrate-receive"
t1=$(uptime_s)
metric migrate.migrate_s "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')" s
NEW=$(xl domid domu1 2>/dev/null || echo none)
log "domu1: domid $OLD before, $NEW after migration"
check new-domid test "$NEW" != none -a "$NEW" != "$OLD"
check runs-after-migrate wait_domu domu1 "^tick [0-9]+ domid=$NEW" 60
check vif-on-bridge-after-migrate wait_until 30 test -e "/sys/class/net/xenbr0/brif/vif$NEW.0"
check ping-after-migrate wait_until 60 ping -c 1 -W 2 "$LAB_NET_DOMU1"
xl list
xenstore-write "/local/domain/$NEW/data/lab-moved" 1 "/local/domain/$D2/data/lab-moved" 1
