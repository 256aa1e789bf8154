# bench, domu1: the server side of every transport, one phase after the
# other (domu2 runs the clients in the same order; every client retries
# its connect until its server is up).
. /scenario/params.sh
PEER=$(xlbench xsread data/peer 60)
ME=$(own_domid)
# af_xen.ko idles until dom0 makes the link directories; no traffic on it
# until the AF_XEN phase
check afxen-insmod insmod /opt/xensock/af_xen.ko

# ---- baselines: TCP over netfront, iperf3, libxenvchan ---------------------------
timeout 500 xlbench tcp server 7001 "$BENCH_MIB" "$BENCH_PINGS" > /tmp/tcp.log 2>&1 &
TCP=$!
timeout 500 iperf3 -s -1 -p 5201 > /tmp/iperf3.log 2>&1 &
IPERF=$!
timeout 500 xlbench vchan server "$PEER" "/local/domain/$ME/data/bench-vchan" "$BENCH_MIB" "$BENCH_PINGS" 65536 > /tmp/vchan.log 2>&1 &
VCHAN=$!
# libxenvchan's largest ring (1 MiB each way), closer to xensock's ring sizes
timeout 500 xlbench vchan server "$PEER" "/local/domain/$ME/data/bench-vchan1m" "$BENCH_MIB" "$BENCH_PINGS" 1048576 > /tmp/vchan1m.log 2>&1 &
VCHAN1M=$!
check_wait tcp-server "$TCP" /tmp/tcp.log
check_wait iperf3-server "$IPERF" /tmp/iperf3.log
check_wait vchan-server "$VCHAN" /tmp/vchan.log
check_wait vchan-1m-server "$VCHAN1M" /tmp/vchan1m.log
cat /tmp/tcp.log /tmp/vchan.log /tmp/vchan1m.log

# ---- AF_XEN: the kernel family, from C (xlbench) and through libxensock ----------
# event-channel interrupts of the module around the AF_XEN runs: how many
# notifications the 64 MiB cost (docs/design.md, lab benchmark)
irqs() { awk '/af_xen/ {n = 0; for (i = 2; i <= NF; i++) if ($i ~ /^[0-9]+$/) n += $i; else break; t += n} END {print t + 0}' /proc/interrupts; }
IRQ0=$(irqs)
timeout 200 xlbench-xs xen server 7301 "$BENCH_MIB" "$BENCH_PINGS" > /tmp/afxen.log 2>&1 &
check_wait afxen-server $! /tmp/afxen.log
cat /tmp/afxen.log
log "af_xen interrupts during the C AF_XEN run (server side): $(( $(irqs) - IRQ0 ))"
grep af_xen /proc/interrupts
timeout 200 lab_bench server kernel 7302 "$BENCH_MIB" "$BENCH_PINGS" > /tmp/afxen-rust.log 2>&1 &
check_wait afxen-libxensock-server $! /tmp/afxen-rust.log
cat /tmp/afxen-rust.log
# diagnostics: libxensock over AF_XEN came out 3-6x slower than C over it
# (runs bench-20261122-065701, bench-20261122-070841); cross the two
# programs to find the slow side, and repeat C to see order effects
timeout 200 lab_bench server kernel 7304 "$BENCH_MIB" "$BENCH_PINGS" > /tmp/x1.log 2>&1 &
check_wait afxen-c-to-rust-server $! /tmp/x1.log
timeout 200 xlbench-xs xen server 7305 "$BENCH_MIB" "$BENCH_PINGS" > /tmp/x2.log 2>&1 &
check_wait afxen-rust-to-c-server $! /tmp/x2.log
timeout 200 xlbench-xs xen server 7306 "$BENCH_MIB" "$BENCH_PINGS" > /tmp/x3.log 2>&1 &
check_wait afxen-again-server $! /tmp/x3.log
cat /proc/net/af_xen
check afxen-dmesg-clean sh -c '! dmesg | grep -E "BUG|Oops|WARNING|general protection|refcount_t"'
dmesg | grep af_xen | tail -n 5
# the module and the user-space transport both own data/xensock/link: unload first
check afxen-rmmod rmmod af_xen

# ---- libxensock's user-space transport over /dev/xen -----------------------------
# dom0 clears the link directories once both modules are gone, then says go
xlbench xsread data/bench-user-go 400 > /dev/null || log "no go from dom0 after 400 s"
timeout -s KILL 200 lab_bench server user 7303 "$BENCH_MIB" "$BENCH_PINGS" > /tmp/user.log 2>&1 &
# judged by its log, not its exit: in run bench-20261122-070841 the server
# answered every ping and then never exited (the transport's teardown
# stalled), which held the whole lab until it was killed
if wait_until 200 grep -q "echoed $BENCH_PINGS pings" /tmp/user.log; then result xensock-user-server PASS
else tail -n 15 /tmp/user.log; result xensock-user-server FAIL "no complete run in its log"; fi
cat /tmp/user.log
sleep 10
for p in $(pidof lab_bench); do
  log "lab_bench (pid $p) still running 10 s after its last echo: teardown stalled"
  for t in /proc/$p/task/*; do echo "  [stall] $t wchan=$(cat $t/wchan 2>/dev/null) $(grep State $t/status)"; done
  kill -9 $p
done
