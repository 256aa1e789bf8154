# kmod-migrate, domu1: the server end of the stream, its leg listener
# receives the client's legs (one good, one with a wrong cookie) and raw hellos.
. /scenario/common.sh
run_c c-migrate-server server $M_PORT $STREAM_MIB
cat /proc/net/af_xen_stats
# without the test mode the trigger is refused (EPERM): reload plain, and
# an unconnected socket's setsockopt must be EPERM before anything else
rmmod af_xen
insmod $KO
run_c kmod-open-leg-refused-without-test-mode eperm
finish
