# mpi scenario, domu2: mpirun for every job, ranks here and on domu1.
MY_IP=$LAB_NET_DOMU2
. /scenario/common.sh
. /scenario/mpi.sh
hostname domu2
mig_setup
check mpi-exec-reachable wait_until 300 sh -c "xrsh domu1 true"

# the BTL is chosen for the other domU's rank, over af_xen.ko
across 1 --mca btl self,xensock --mca btl_base_verbose 10 /opt/xensock/bin/xsmpi check --max 1048576 \
  > /tmp/check1.log 2>&1
grep -E 'btl:xensock|Using .* btl' /tmp/check1.log | sed 's/^/  [check] /' | head -n 12
check mpi-xensock-selected test "$(grep -c 'Using xensock btl for send to' /tmp/check1.log)" -eq 2
check mpi-backend grep -q "btl:xensock: listening: domain .* $(backend_line)" /tmp/check1.log
check mpi-check-one-per-domu grep -q '^xsmpi check ok' /tmp/check1.log
# without --mca btl: Open MPI's own choice (exclusivity puts xensock above
# tcp) picks xensock for the other domU's rank
across 1 --mca btl_base_verbose 10 /opt/xensock/bin/xsmpi check --max 65536 > /tmp/check0.log 2>&1
check mpi-chosen-by-default sh -c "[ \$(grep -c 'Using xensock btl for send to' /tmp/check0.log) -eq 2 ] &&
  ! grep -q 'Using tcp btl for send to' /tmp/check0.log && grep -q '^xsmpi check ok' /tmp/check0.log" ||
  grep -E 'Using .* btl' /tmp/check0.log | head -n 6
# two ranks per domU: vader inside each, xensock across
daemons_start
across 2 --mca btl self,vader,xensock --mca btl_base_verbose 10 /opt/xensock/bin/xsmpi check --max 262144 \
  > /tmp/check2.log 2>&1
daemons_stop
check mpi-check-two-per-domu grep -q '^xsmpi check ok: 4 ranks' /tmp/check2.log || tail -n 30 /tmp/check2.log
check mpi-two-per-domu-pairs sh -c "[ \$(grep -c 'Using xensock btl for send to' /tmp/check2.log) -eq 8 ] &&
  [ \$(grep -c 'Using vader btl for send to' /tmp/check2.log) -eq 4 ]"
# NetPIPE (nobody here wrote it) in its integrity mode, over xensock
(cd /tmp && across 1 --mca btl self,xensock NPopenmpi -i -n 20 -u 1048576 -o /tmp/np.out) > /tmp/np.log 2>&1
tail -n 4 /tmp/np.log | sed 's/^/  [NPopenmpi] /'
check mpi-netpipe-integrity sh -c "! grep -qi 'error\|fail' /tmp/np.log &&
  [ \$(grep -c 'Integrity check passed' /tmp/np.log) -ge 30 ] && grep -q '786433 bytes .* passed' /tmp/np.log"
# a first short ping-pong with the BTL's lifecycle lines
MPI_LIMIT=120 across 1 --mca btl self,xensock --mca btl_base_verbose 10 /opt/xensock/bin/xsmpi pingpong --max 64 --iters 5 \
  > /tmp/pp0.log 2>&1; log "short ping-pong: exit $?"
grep -E 'btl:xensock|^pingpong' /tmp/pp0.log | sed 's/^/  [pp0] /'
[ "$MPI_STACK" = kmod ] && sed 's/^/  [af_xen] /' /proc/net/af_xen
mpi_bench

# a job that runs through domu1's moves: checked exchanges until told to stop
rm -f $STOP
MPI_LIMIT=1800 across 1 --mca btl self,xensock /opt/xensock/bin/xsmpi soak --until $STOP > /tmp/soak.log 2>&1 &
SOAK=$!
check mpi-soak-running sh -c "sleep 5; kill -0 $SOAK"
xrsh domu1 touch /tmp/mpi.started
for m in $MIG_MOVES; do run_phase client "$m"; done
sleep 5
if [ "$MPI_STACK" = kmod ]; then
  sed 's/^/  [af_xen] /' /proc/net/af_xen
  check mpi-soak-on-ring-after wait_until 60 all_on_ring
fi
touch $STOP
wait $SOAK; _rc=$?
tail -n 5 /tmp/soak.log | sed 's/^/  [soak] /'
check mpi-soak-across-moves sh -c "[ $_rc -eq 0 ] && grep -q '^xsmpi soak ok' /tmp/soak.log"
[ "$MPI_STACK" = kmod ] && check mpi-sockets-released wait_until 30 btl_sockets_gone
[ "${MPI_SWEEP:-0}" = 1 ] && mpi_sweep
xrsh domu1 touch /tmp/mpi.done
mig_finish
