# smoke, domu2: clients of domu1's servers.
PEER=$(xlbench xsread data/peer 60)
log "domid $(own_domid), peer domu1 is dom$PEER"
. /scenario/common.sh
check ping-domu1 wait_until 60 ping -c 1 -W 2 "$LAB_NET_DOMU1"
check tcp-client xlbench tcp client "$LAB_NET_DOMU1" 7001 4 100 120
check vchan-client xlbench vchan client "$PEER" "/local/domain/$PEER/data/lab-vchan" 4 100 120
