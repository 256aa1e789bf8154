# bench, dom0: the link directories af_xen.ko needs (standing in for the
# discovery agent: mklink of lab/guest/lib.sh), and the switch from the
# kernel family to the user-space transport: both own a domain's
# data/xensock/link, so the user-space phase starts only after both
# domUs unloaded the module and the directories are gone.
D1=$(xl domid domu1); D2=$(xl domid domu2)
# the xenstore tools are one binary that dispatches on its name
ln -sf /usr/bin/xenstore-write /tmp/xenstore-rm
wait_domu domu1 'afxen-insmod (PASS|FAIL)' 120
wait_domu domu2 'afxen-insmod (PASS|FAIL)' 120
mklink "$D1" "$D2" && mklink "$D2" "$D1"
check xs-link-connected wait_until 240 sh -c "test \"\$(xenstore-read /local/domain/$D1/data/xensock/link/$D2/state)\" = 4 && test \"\$(xenstore-read /local/domain/$D2/data/xensock/link/$D1/state)\" = 4"
wait_domu domu1 'afxen-rmmod (PASS|FAIL)' 800
wait_domu domu2 'afxen-rmmod (PASS|FAIL)' 800
xenstore-ls /local/domain/$D1/data/xensock 2>&1 | head -n 20
/tmp/xenstore-rm /local/domain/$D1/data/xensock/link /local/domain/$D2/data/xensock/link
xenstore-write /local/domain/$D1/data/bench-user-go 1 /local/domain/$D2/data/bench-user-go 1
log "user-space phase: go"
