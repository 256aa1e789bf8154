# bench, domu1: the server side of every transport. domu2 runs the
# clients in rounds (tcp, vchan, vchan-1m, afxen, afxen-1m, BENCH_REPS
# times, interleaved so that host load hits every transport alike; each
# of these also once more unchecked, right after its checked run); here
# each transport has one background loop that serves one connection per
# round, in order. Every client retries its connect until its server is up.
. /scenario/params.sh
PEER=$(xlbench xsread data/peer 60)
ME=$(own_domid)
# af_xen.ko idles until dom0 makes the link directories; no traffic on it
# until the first AF_XEN round
check afxen-insmod insmod /opt/xensock/af_xen.ko
# this domain's cost of memcpy, memcmp, a system call and a pipe's kernel
# copies under the emulation (docs/lab.md, "Where the time goes")
xlbench-xs calib

# serve_rounds LOG 'CMD' [unchecked]: CMD once per round, eval'd with
# $ROUND set and $PINGS the round trips to echo; fails if any round
# failed. With "unchecked", each round serves a second connection right
# after the first: the same stream read into the same 64 KiB buffer but
# not compared (XLBENCH_NOCHECK, the iperf-style rows "<row>-unchecked";
# no round trips), $MODE "-u" (for names that must differ)
serve_rounds() {
  _ok=0
  for ROUND in $(seq "$BENCH_REPS"); do
    MODE= PINGS=$BENCH_PINGS
    eval "timeout 300 $2" >> "$1" 2>&1 || _ok=1
    if [ "$3" = unchecked ]; then
      MODE=-u PINGS=0
      eval "timeout 300 env XLBENCH_NOCHECK=1 $2" >> "$1" 2>&1 || _ok=1
    fi
  done
  return $_ok
}
if phase main; then # ---- every transport's servers, the timed rows, libxensock ----
timeout 800 iperf3 -s -1 -p 5201 > /tmp/iperf3.log 2>&1 &
IPERF=$!
serve_rounds /tmp/tcp.log 'xlbench tcp server 7001 $BENCH_MIB $PINGS' unchecked &
TCP=$!
serve_rounds /tmp/vchan.log 'xlbench vchan server $PEER /local/domain/$ME/data/bench-vchan-$ROUND$MODE $BENCH_MIB $PINGS 65536' unchecked &
VCHAN=$!
# libxenvchan's largest ring (1 MiB each way), closer to xensock's ring sizes
serve_rounds /tmp/vchan1m.log 'xlbench vchan server $PEER /local/domain/$ME/data/bench-vchan1m-$ROUND$MODE $BENCH_MIB $PINGS 1048576' unchecked &
VCHAN1M=$!
# AF_XEN with the module's default ring (128 KiB), and with SO_RCVBUF =
# SO_SNDBUF = 1 MiB (a 1 MiB ring each way, as vchan-1m)
serve_rounds /tmp/afxen.log 'xlbench-xs xen server 7301 $BENCH_MIB $PINGS' unchecked &
AFXEN=$!
serve_rounds /tmp/afxen1m.log 'env XLBENCH_BUF=1048576 xlbench-xs xen server 7311 $BENCH_MIB $PINGS' unchecked &
AFXEN1M=$!
# AF_XEN with SO_RCVBUF 128 KiB: the default ring under grant pressure
# (without SO_RCVBUF a stream gets 1 MiB while the module's grants are few)
serve_rounds /tmp/afxen128k.log 'env XLBENCH_BUF=131072 xlbench-xs xen server 7331 $BENCH_MIB $PINGS' &
AFXEN128K=$!
# and the same with SO_BUSY_POLL 1000 us on both ends (spin on the ring
# before sleeping; under TCG a round trip takes about a millisecond)
serve_rounds /tmp/afxen1mbusy.log 'env XLBENCH_BUF=1048576 XLBENCH_BUSY_POLL=1000 xlbench-xs xen server 7321 $BENCH_MIB $PINGS' &
AFXEN1MBUSY=$!
# and with ring writes by copy_from_iter_nocache (XENSOCK_COPY_ROUTINE,
# docs/design.md "Ring copies"): does the writer's copy routine matter?
serve_rounds /tmp/afxen1mnt.log 'env XLBENCH_BUF=1048576 XLBENCH_COPY=1 xlbench-xs xen server 7341 $BENCH_MIB $PINGS' &
AFXEN1MNT=$!
check_wait tcp-server "$TCP" /tmp/tcp.log
check_wait vchan-server "$VCHAN" /tmp/vchan.log
check_wait vchan-1m-server "$VCHAN1M" /tmp/vchan1m.log
check_wait afxen-server "$AFXEN" /tmp/afxen.log
check_wait afxen-1m-server "$AFXEN1M" /tmp/afxen1m.log
check_wait afxen-128k-server "$AFXEN128K" /tmp/afxen128k.log
check_wait afxen-1m-busy-server "$AFXEN1MBUSY" /tmp/afxen1mbusy.log
check_wait afxen-1m-nocache-server "$AFXEN1MNT" /tmp/afxen1mnt.log
# the timed rows, once each after the rounds: the module sums where the
# time of sendmsg/recvmsg goes (time_data_path; off for the rows above,
# as reading the clock costs something under emulation) and xlbench
# prints it per 64 KiB (docs/lab.md, "Where the time goes in bench")
echo 1 > /sys/module/af_xen/parameters/time_data_path
timeout 300 xlbench-xs xen server 7351 "$BENCH_MIB" "$BENCH_PINGS" > /tmp/afxen-timed.log 2>&1 &
check_wait afxen-timed-server $! /tmp/afxen-timed.log
XLBENCH_BUF=1048576 timeout 300 xlbench-xs xen server 7361 "$BENCH_MIB" "$BENCH_PINGS" > /tmp/afxen1m-timed.log 2>&1 &
check_wait afxen-1m-timed-server $! /tmp/afxen1m-timed.log
echo 0 > /sys/module/af_xen/parameters/time_data_path
cat /tmp/afxen-timed.log /tmp/afxen1m-timed.log
check_wait iperf3-server "$IPERF" /tmp/iperf3.log
cat /tmp/tcp.log /tmp/vchan.log /tmp/vchan1m.log /tmp/afxen.log /tmp/afxen1m.log /tmp/afxen128k.log /tmp/afxen1mbusy.log \
  /tmp/afxen1mnt.log
grep af_xen /proc/interrupts

# ---- AF_XEN through libxensock (kernel backend), once ----------------------------
timeout 200 lab_bench server kernel 7302 "$BENCH_MIB" "$BENCH_PINGS" > /tmp/afxen-rust.log 2>&1 &
check_wait afxen-libxensock-server $! /tmp/afxen-rust.log
cat /tmp/afxen-rust.log
fi # phase main

# ---- af_xen.ko's TCP carrier, the server ends (domu2.sh says how) ----
if phase tcp-carrier; then
echo 30000 > /sys/module/af_xen/parameters/peer_lost_ms
SOCKETS_BEFORE=$(af_sockets)
perf_start tcpc-server
# (BENCH_KTCPC=paired: one client drives both rows in turns of a quarter,
# each acknowledged)
SEGS=1; [ "$BENCH_KTCPC" = paired ] && SEGS=4
serve_rounds /tmp/tcp-same.log 'env XLBENCH_SEGMENTS=$SEGS xlbench tcp server 7002 $BENCH_MIB $PINGS' &
TCPSAME=$!
serve_rounds /tmp/afxen-tcpc.log 'env XLBENCH_SEGMENTS=$SEGS XLBENCH_LABEL=afxen-tcp-carrier xlbench-xs xen server 7371 $BENCH_MIB $PINGS' &
TCPC=$!
# (a server writes its log when it ends: one per round, a few seconds each)
rm -f /tmp/stall-watch.stop
stall_watch /tmp/afxen-tcpc.log 40 xlbench-xs xlbench &
STALL_WATCH=$!
check_wait tcp-same-phase-server "$TCPSAME" /tmp/tcp-same.log
check_wait afxen-tcp-carrier-server "$TCPC" /tmp/afxen-tcpc.log
touch /tmp/stall-watch.stop
wait "$STALL_WATCH"
cat /tmp/tcp-same.log /tmp/afxen-tcpc.log
# (paired: each server's segments, when the other row's server is idle)
WIN=stream; [ "$SEGS" -gt 1 ] && WIN=segment
perf_report tcpc-server \
  "tcp-same-phase server" "$(perf_windows /tmp/tcp-same.log "xlbench tcp server $WIN")" \
  "afxen-tcp-carrier server" "$(perf_windows /tmp/afxen-tcpc.log "xlbench afxen-tcp-carrier server $WIN")"
# dom0 links the pair again after the last round: the module stays until then
# (unloaded first, the link never comes back)
xlbench xsread "data/tcpc-linked-$BENCH_REPS" 120 > /dev/null || log "no links from dom0 after the TCP carrier phase"
check afxen-tcp-carrier-sockets-freed af_sockets_back_to "$SOCKETS_BEFORE"
fi # phase tcp-carrier
cat /proc/net/af_xen /proc/net/af_xen_stats
check afxen-dmesg-clean sh -c '! dmesg | grep -E "BUG|Oops|WARNING|general protection|refcount_t"'
dmesg | grep af_xen | tail -n 5
# the module and the user-space transport both own data/xensock/link: unload first
check afxen-rmmod rmmod af_xen

phase user || exit 0
# ---- libxensock's user-space transport over /dev/xen -----------------------------
# dom0 clears the link directories once both modules are gone, then says go
xlbench xsread data/bench-user-go 400 > /dev/null || log "no go from dom0 after 400 s"
timeout -s KILL 200 lab_bench server user 7303 "$BENCH_MIB" "$BENCH_PINGS" > /tmp/user.log 2>&1 &
# judged by its log, not its exit: a server that answered every ping and
# then stalled in the transport's teardown must not hold the whole lab
if wait_until 200 grep -q "echoed $BENCH_PINGS pings" /tmp/user.log; then result xensock-user-server PASS
else tail -n 15 /tmp/user.log; result xensock-user-server FAIL "no complete run in its log"; xs_check user-server; fi
cat /tmp/user.log
sleep 10
for p in $(pidof lab_bench); do
  log "lab_bench (pid $p) still running 10 s after its last echo: teardown stalled"
  for t in /proc/$p/task/*; do echo "  [stall] $t wchan=$(cat $t/wchan 2>/dev/null) $(grep State $t/status)"; done
  xs_check user-teardown
  kill -9 $p
done

# ---- the user-space transport's TCP carrier against plain TCP, same phase ----
# lab_bench user-tcpc (lab/harness/src/bin/lab_bench.rs): per round one
# plain TCP connection, then one the client's suspend hook moves off its
# ring onto the TCP carrier; one process and transport for all rounds.
# Judged by its log, as the server above.
perf_start user-tcpc-server
timeout -s KILL $((TCPC_SECS + 100)) $BENCH_WRAP lab_bench server "$BENCH_TCPC" 7304 7004 "$BENCH_MIB" "$BENCH_PINGS" "$BENCH_REPS" > /tmp/user-tcpc.log 2>&1 &
if wait_until $((TCPC_SECS + 100)) grep -q "served $BENCH_REPS rounds" /tmp/user-tcpc.log && ! grep -q "intact false" /tmp/user-tcpc.log; then
  result xensock-user-tcp-carrier-server PASS
else tail -n 15 /tmp/user-tcpc.log; result xensock-user-tcp-carrier-server FAIL "not every round served intact"; xs_check user-tcpc-server; fi
cat /tmp/user-tcpc.log
perf_report user-tcpc-server \
  "tcp-same-phase-user server" "$(perf_windows /tmp/user-tcpc.log 'lab_bench tcp-same-phase-user server stream')" \
  "xensock-user-tcp-carrier server" "$(perf_windows /tmp/user-tcpc.log 'lab_bench xensock-user-tcp-carrier server stream')"
sleep 5
for p in $(pidof lab_bench); do
  log "lab_bench (pid $p) still running 5 s after its last round: teardown stalled"
  kill -9 $p
done
