# kmod-migrate, domu1: the server end of the stream, its leg listener
# receives the client's legs (one good, one with a wrong cookie) and raw
# hellos; then the server end of the move test.
. /scenario/common.sh
run_c c-migrate-server server $M_PORT $STREAM_MIB
cat /proc/net/af_xen_stats
mv_bound_on
run_c c-move-server move-server $MV_PORT
mv_bound_off
run_c c-save-server move-server $SV_PORT sv
# the close-first test: we close first with the connection on TCP (dom0
# ends the pair's link when the client says so, and links it again after)
run_c c-closefirst-server closefirst-server $CF_PORT
dmesg | grep -E 'af_xen.*(connection|link)' | tail -n 40
# without the test mode the trigger is refused (EPERM): reload plain, and
# an unconnected socket's setsockopt must be EPERM before anything else
rmmod af_xen
insmod $KO
run_c kmod-open-leg-refused-without-test-mode eperm
# the death test: a peer destroyed with the connection on TCP resets it
# within the bound (dom0 ends the pair's link, then destroys domu2)
rmmod af_xen
insmod $KO peer_lost_ms=$DD_BOUND_MS
run_c c-dead-server dead-server $DD_PORT
finish
