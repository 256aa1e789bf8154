# Migration scenarios, domu1: the domain that moves (save/restore, away,
# live migration); the server end of every stream.
MY_IP=$LAB_NET_DOMU1
. /scenario/common.sh
mig_setup
for m in $MIG_MOVES; do run_phase server "$m"; done
mig_finish
