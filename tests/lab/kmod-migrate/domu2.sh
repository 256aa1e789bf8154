# kmod-migrate, domu2: the client end; first raw TCP hellos to domu1's leg
# listener (garbage, an unknown connection id), then the stream; then the
# client end of the move test, whose phases dom0 follows in this log.
. /scenario/common.sh
PEER=$(xlbench xsread data/peer 60)
log "peer domu1 is dom$PEER"
run_c c-migrate-client client "$PEER" $M_PORT $STREAM_MIB 10.0.0.11 $LEG_PORT
cat /proc/net/af_xen_stats
run_c c-move-client move-client "$PEER" $MV_PORT
# domu1 is saved and restored during this one: it comes back as a new
# domid, the connection follows it
run_c c-save-client move-client "$PEER" $SV_PORT sv
dmesg | grep -E 'af_xen.*(connection|link)' | tail -n 40
finish
