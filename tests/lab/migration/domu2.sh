# Migration scenarios, domu2: stays where it is; the client end of every
# stream, connecting to domu1's current domid (dom0 tells it per move).
MY_IP=$LAB_NET_DOMU2
. /scenario/common.sh
mig_setup
for m in $MIG_MOVES; do run_phase client "$m"; done
mig_finish
