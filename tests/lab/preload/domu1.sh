# preload scenario, domu1 (saved and restored mid-run): the servers, under
# the preload library (apps.sh), and the server end of the checked stream.
MY_IP=$LAB_NET_DOMU1
. /scenario/common.sh
. /scenario/apps.sh
mig_setup
apps_servers
apps_wait_client
for m in $MIG_MOVES; do run_phase server "$m"; done
apps_servers_finish
mig_finish
