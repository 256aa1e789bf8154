# mpi scenario, domu1 (saved and restored, then marked away and back, while
# a job runs): the exec service mpirun launches its daemon through, and the
# server end of the migration machinery's checked stream.
MY_IP=$LAB_NET_DOMU1
. /scenario/common.sh
. /scenario/mpi.sh
hostname domu1
mig_setup
mpi_exec_service
# the moves start once domu2's one-shot jobs are done and its long job runs
check mpi-soak-started wait_until 900 test -f /tmp/mpi.started
for m in $MIG_MOVES; do run_phase server "$m"; done
# the ranks here belong to domu2's jobs: stay until it says they are done
check mpi-job-done wait_until 1500 test -f /tmp/mpi.done
[ "$MPI_STACK" = kmod ] && check mpi-sockets-released wait_until 30 btl_sockets_gone
kill "$EXEC_PID" 2>/dev/null
mig_finish
