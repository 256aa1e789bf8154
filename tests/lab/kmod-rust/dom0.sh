# kmod-rust, dom0: stand in for the discovery agent and make the link
# directories /local/domain/<A>/data/xensock/link/<B> ("nA,rB") both ways,
# with mklink (lab/guest/lib.sh).
D1=$(xl domid domu1); D2=$(xl domid domu2)
log "link directories: dom$D1 <-> dom$D2"
# both modules must be loaded first: each reacts to link/<B> appearing
wait_domu domu1 'kmod-insmod PASS' 120
wait_domu domu2 'kmod-insmod PASS' 120
mklink "$D1" "$D2" && mklink "$D2" "$D1"
check xs-link-perms sh -c "xenstore-ls -p /local/domain/$D1/data/xensock | grep -q 'n$D1,r$D2' && xenstore-ls -p /local/domain/$D2/data/xensock | grep -q 'n$D2,r$D1'"
check xs-link-connected wait_until 240 sh -c "test \"\$(xenstore-read /local/domain/$D1/data/xensock/link/$D2/state)\" = 4 && test \"\$(xenstore-read /local/domain/$D2/data/xensock/link/$D1/state)\" = 4"
xenstore-ls /local/domain/$D1/data/xensock
