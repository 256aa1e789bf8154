# preload scenario, domu2: the clients, under the preload library
# (apps.sh): one-shot checks first, then workloads across domu1's move.
MY_IP=$LAB_NET_DOMU2
. /scenario/common.sh
. /scenario/apps.sh
mig_setup
apps_once
apps_during_start
# run_phase calls phase_checked once the move is over, before it says so
phase_checked() { apps_during_check; }
for m in $MIG_MOVES; do run_phase client "$m"; done
mig_finish
