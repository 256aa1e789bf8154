# kmod, domu2: single-domain tests, then the cross-domain client.
. /scenario/common.sh
PEER=$(xlbench xsread data/peer 60)
log "peer domu1 is dom$PEER"
run_c c-xclient xclient "$PEER" 64
if xstest-seqpacket client "$PEER" 256; then result c-sp-client PASS; else result c-sp-client FAIL "rc=$?"; fi
# domu1 unloads its module after its tests: the link goes down here, with
# no socket left on it
check kmod-peer-unload-link-down wait_until 300 sh -c "dmesg | grep -q 'link to dom$PEER down'"
dmesg | grep af_xen | tail -n 20
check kmod-rmmod-domu2 rmmod af_xen
check kmod-dmesg-clean-domu2 sh -c '! dmesg | grep -E "BUG|Oops|WARNING|general protection|refcount_t|leak"'
dmesg | tail -n 20
