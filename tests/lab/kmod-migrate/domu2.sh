# kmod-migrate, domu2: the client end; first raw TCP hellos to domu1's leg
# listener (garbage, an unknown connection id), then the stream; then the
# client end of the move test, whose phases dom0 follows in this log.
. /scenario/common.sh
PEER=$(xlbench xsread data/peer 60)
log "peer domu1 is dom$PEER"
run_c c-migrate-client client "$PEER" $M_PORT $STREAM_MIB 10.0.0.11 $LEG_PORT
cat /proc/net/af_xen_stats
mv_bound_on
run_c c-move-client move-client "$PEER" $MV_PORT
mv_bound_off
# domu1 is saved and restored during this one: it comes back as a new
# domid, the connection follows it
run_c c-save-client move-client "$PEER" $SV_PORT sv
PEER_NOW=$(xlbench xsread data/peer-now 60)
log "domu1 is dom$PEER_NOW now"
# the server closes first with the connection on TCP: EOF after all its
# bytes, EPIPE on our next send, our socket gone soon after our close
run_c c-closefirst-client closefirst-client "$PEER_NOW" $CF_PORT
dmesg | grep -E 'af_xen.*(connection|link)' | tail -n 40
finish
# the victim of domu1's death test outlives this script (this domain stays
# up after @@EXIT; dom0 destroys it once the connection is on TCP); domu1
# came back from its save under a new domid (dom0 says which)
check kmod-reload-domu2 insmod $KO peer_lost_ms=$DD_BOUND_MS
xstest_migrate dead-client "$PEER_NOW" $DD_PORT &
sleep 1
