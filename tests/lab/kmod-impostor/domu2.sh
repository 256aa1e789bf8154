# kmod-impostor, domu2: the client end, the stayer. While domu1 is away,
# domu3 sends ring offers naming our connections as if it were domu1 under
# a new domid: they are kept (a candidate), never taken, and the
# connection is handed to the restored domu1 only once it switched onto
# the ring we granted it.
. /scenario/common.sh
PEER=$(xlbench xsread data/peer 60)
log "peer domu1 is dom$PEER"
run_c c-save-client move-client "$PEER" $SV_PORT sv
IMP=$(xlbench xsread data/impostor 120)
NEW=$(xlbench xsread data/restored 10)
log "impostor dom$IMP, domu1 restored as dom$NEW"
dmesg | grep -E 'af_xen.*(connection|link|inject)' | tail -n 40
grep -E 'switch_(peer_candidates|peers_proved|offers)' /proc/net/af_xen_stats
check impostor-offers-kept sh -c "dmesg | grep -q 'ring offer from dom$IMP, not the peer.s domain'"
check impostor-not-adopted sh -c "! dmesg | grep -q 'is now dom$IMP\$'"
check restored-peer-proved sh -c "dmesg | grep -q 'dom$NEW proved to be the peer'"
check restored-peer-adopted sh -c "dmesg | grep -q 'peer dom$PEER is now dom$NEW\$'"
finish
