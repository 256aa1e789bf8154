# Open MPI across the domUs (sourced by domu1.sh and domu2.sh after
# common.sh): domu2 runs mpirun, which starts its daemon on domu1 through
# the lab's exec service (xrsh: a shell on a socat listener), since the
# guests have no ssh.
. /opt/xensock/mpi.params
EXEC_PORT=2222
STOP=/tmp/mpi-soak.stop
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_plm_rsh_agent=/opt/xensock/bin/xrsh OMPI_MCA_plm_rsh_no_tree_spawn=1
export OMPI_MCA_btl_tcp_if_include=eth0 OMPI_MCA_oob_tcp_if_include=eth0
# one vCPU per domU: ranks sharing it yield instead of spinning
export OMPI_MCA_mpi_yield_when_idle=1
# the lab kernel has no CONFIG_CROSS_MEMORY_ATTACH (process_vm_readv says
# ENOSYS), vader's single-copy path for large messages
export OMPI_MCA_btl_vader_single_copy_mechanism=none

mpi_exec_service() {
  socat TCP-LISTEN:$EXEC_PORT,reuseaddr,fork EXEC:/bin/sh,stderr > /tmp/exec.log 2>&1 &
  EXEC_PID=$!
  check mpi-exec-service wait_until 20 sh -c "echo true | socat - TCP:127.0.0.1:$EXEC_PORT"
}

# mpirun across the domUs: N ranks per domU, rank 0 on domu2
across() {
  _per=$1; shift
  timeout "${MPI_LIMIT:-600}" mpirun --host "domu2:$_per,domu1:$_per" --map-by node -np $((_per * 2)) "$@"
}

# ping-pong table of one configuration in one round: "pingpong SIZE
# LAT_US MBPS" lines in /tmp/pp-NAME.ROUND.out
bench_one() {
  _name=$1; _round=$2; shift 2
  _out=/tmp/pp-$_name.$_round.out
  MPI_LIMIT=300 "$@" /opt/xensock/bin/xsmpi pingpong --min 1 --max 4194304 --step 4 --iters "$MPI_BENCH_ITERS" \
    > "$_out" 2> "/tmp/pp-$_name.err"
  _rc=$?
  sed "s/^/  [$_name round $_round] /" "$_out"
  [ $_rc -eq 0 ] && grep -q '^pingpong 4194304 ' "$_out" && return 0
  log "$_name: exit $_rc"
  tail -n 30 "/tmp/pp-$_name.err"
  return 1
}
median() { sort -n | awk '{v[NR] = $1} END {if (NR) print v[int((NR + 1) / 2)]; else print 0}'; }
# medians over the rounds
lat() { cat /tmp/pp-"$1".*.out 2>/dev/null | awk -v n="$2" '$1 == "pingpong" && $2 == n {print $3}' | median; }
bw() { cat /tmp/pp-"$1".*.out 2>/dev/null | awk -v n="$2" '$1 == "pingpong" && $2 == n {print $4}' | median; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.2f", a / b; else print 0}'; }

# MPI_BENCH_ROUNDS interleaved rounds of the three configurations
mpi_bench() {
  _ok_tcp=1; _ok_xs=1; _ok_vader=1
  for r in $(seq "$MPI_BENCH_ROUNDS"); do
    bench_one tcp "$r" across 1 --mca btl self,tcp || _ok_tcp=0
    bench_one xensock "$r" across 1 --mca btl self,xensock || _ok_xs=0
    bench_one xensock-inq "$r" across 1 --mca btl self,xensock --mca btl_xensock_check_readable 1 || _ok_xs=0
    bench_one vader "$r" timeout 600 mpirun --host domu2:2 -np 2 --mca btl self,vader || _ok_vader=0
  done
  check mpi-bench-tcp test $_ok_tcp = 1
  check mpi-bench-xensock test $_ok_xs = 1
  check mpi-bench-vader test $_ok_vader = 1
  log "bench: ping-pong half round trip (us) and bandwidth (MB/s), medians of $MPI_BENCH_ROUNDS rounds; domUs have 1 vCPU each"
  for n in 1 64 1024 16384 262144 1048576 4194304; do
    log "  $n B: tcp $(lat tcp $n) us $(bw tcp $n) MB/s | xensock $(lat xensock $n) us $(bw xensock $n) MB/s | xensock, FIONREAD first $(lat xensock-inq $n) us $(bw xensock-inq $n) MB/s | vader (one domU) $(lat vader $n) us $(bw vader $n) MB/s"
  done
  metric bench.mpi_lat1_tcp "$(lat tcp 1)" us
  metric bench.mpi_lat1_xensock "$(lat xensock 1)" us
  metric bench.mpi_lat1_vader "$(lat vader 1)" us
  metric bench.mpi_lat1_xensock_vs_tcp "$(ratio "$(lat xensock 1)" "$(lat tcp 1)")" x
  metric bench.mpi_lat1_xensock_vs_vader "$(ratio "$(lat xensock 1)" "$(lat vader 1)")" x
  metric bench.mpi_lat1_xensock_inq "$(lat xensock-inq 1)" us
  metric bench.mpi_lat1_xensock_inq_vs_vader "$(ratio "$(lat xensock-inq 1)" "$(lat vader 1)")" x
  metric bench.mpi_bw1m_xensock_inq "$(bw xensock-inq 1048576)" MB/s
  metric bench.mpi_bw1m_tcp "$(bw tcp 1048576)" MB/s
  metric bench.mpi_bw1m_xensock "$(bw xensock 1048576)" MB/s
  metric bench.mpi_bw1m_xensock_vs_tcp "$(ratio "$(bw xensock 1048576)" "$(bw tcp 1048576)")" x
}

# MPI_SWEEP=1: the fragment sizes the BTL's defaults come from. Ping-pong
# bandwidth at 256 KiB, 1 MiB and 4 MiB per max_send_size, and latency of
# 16 and 64 KiB messages per eager limit.
mpi_sweep() {
  for m in 65536 131072 262144 524288; do
    across 1 --mca btl self,xensock --mca btl_xensock_max_send_size $m \
      /opt/xensock/bin/xsmpi pingpong --min 262144 --max 4194304 --step 4 --iters 40 > /tmp/sw.out 2>&1
    log "sweep max_send_size $m: $(awk '$1 == "pingpong" {printf "%s B %s MB/s  ", $2, $4}' /tmp/sw.out)"
  done
  for e in 4096 16384 65536 131072; do
    across 1 --mca btl self,xensock --mca btl_xensock_eager_limit $e --mca btl_xensock_rndv_eager_limit $e \
      /opt/xensock/bin/xsmpi pingpong --min 4096 --max 65536 --step 4 --iters 100 > /tmp/sw.out 2>&1
    log "sweep eager_limit $e: $(awk '$1 == "pingpong" {printf "%s B %s us  ", $2, $3}' /tmp/sw.out)"
  done
}

# what the BTL says it runs over
backend_line() {
  if [ "$MPI_STACK" = kmod ]; then echo 'over kernel AF_XEN family'
  else echo 'over user-space transport over /dev/xen'; fi
}
# Several ranks of one guest share the user-space transport through
# `xensock daemon` (its socket at the default path makes every process
# use it); the module needs none.
daemons_start() {
  [ "$MPI_STACK" = kmod ] && return 0
  mkdir -p /run/xensock
  xensock daemon < /dev/null > /tmp/daemon.log 2>&1 &
  DAEMON=$!
  xrsh domu1 "mkdir -p /run/xensock; xensock daemon < /dev/null > /tmp/daemon.log 2>&1 &"
  wait_until 30 test -S /run/xensock/daemon.sock
  wait_until 30 sh -c "xrsh domu1 test -S /run/xensock/daemon.sock"
}
daemons_stop() {
  [ "$MPI_STACK" = kmod ] && return 0
  kill "$DAEMON" 2>/dev/null
  xrsh domu1 "pkill -f 'xensock daemon'; sleep 1; rm -f /run/xensock/daemon.sock"
  sleep 1; rm -f /run/xensock/daemon.sock
}
# no BTL socket is left once the jobs are over: no listener on an
# ephemeral port, no connection between two ephemeral ports (the BTL's;
# the machinery's streams use fixed ports)
btl_sockets_gone() {
  awk 'NR > 1 { split($2, l, ":"); split($3, p, ":")
        if (l[2] >= 49152 && ($1 == "LISTEN" || p[2] >= 49152)) { print; bad = 1 } }
       END { exit bad }' /proc/net/af_xen
}
# the job's af_xen connections (one each way) are there, and every
# connection is on a ring again (none left on a TCP leg)
all_on_ring() {
  awk 'NR > 1 && $1 == "ESTABLISHED" {n++; if ($10 != "ring-xen") bad = 1} END {exit (bad || n < 2)}' /proc/net/af_xen
}
