# kmod-migrate, domu2: the client end; first raw TCP hellos to domu1's leg
# listener (garbage, an unknown connection id), then the stream.
. /scenario/common.sh
PEER=$(xlbench xsread data/peer 60)
log "peer domu1 is dom$PEER"
run_c c-migrate-client client "$PEER" $M_PORT $STREAM_MIB 10.0.0.11 $LEG_PORT
cat /proc/net/af_xen_stats
finish
