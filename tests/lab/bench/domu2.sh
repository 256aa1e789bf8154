# bench, domu2: the client side, one transport at a time, and AF_UNIX
# inside this domain (while domu1's servers idle in accept).
. /scenario/params.sh
PEER=$(xlbench xsread data/peer 60)
check afxen-insmod insmod /opt/xensock/af_xen.ko

log "AF_UNIX inside domu2: $BENCH_MIB MiB + $BENCH_PINGS round trips"
timeout 300 xlbench-xs unix server /tmp/bench.sock "$BENCH_MIB" "$BENCH_PINGS" > /tmp/unix.log 2>&1 &
US=$!
if xlbench-xs unix client /tmp/bench.sock "$BENCH_MIB" "$BENCH_PINGS" 30; then result unix-client PASS
else result unix-client FAIL "rc=$?"; fi
check_wait unix-server $US /tmp/unix.log

log "tcp (netfront): $BENCH_MIB MiB + $BENCH_PINGS round trips"
if xlbench tcp client "$LAB_NET_DOMU1" 7001 "$BENCH_MIB" "$BENCH_PINGS" 120; then result tcp-client PASS
else result tcp-client FAIL "rc=$?"; fi

log "iperf3 (netfront): ${IPERF_SECS}s"
ok=
for try in 1 2 3; do
  if iperf3 -c "$LAB_NET_DOMU1" -p 5201 -t "$IPERF_SECS" -f M > /tmp/iperf3.log 2>&1; then ok=1; break; fi
  sleep 2
done
if [ -n "$ok" ]; then
  metric iperf3.stream_mib_s "$(awk '/receiver/ {print $(NF-2)}' /tmp/iperf3.log)" MiB/s
  result iperf3-client PASS
else tail -5 /tmp/iperf3.log; result iperf3-client FAIL; fi

log "libxenvchan, 64 KiB rings: $BENCH_MIB MiB + $BENCH_PINGS round trips"
if xlbench vchan client "$PEER" "/local/domain/$PEER/data/bench-vchan" "$BENCH_MIB" "$BENCH_PINGS" 120; then
  result vchan-client PASS
else result vchan-client FAIL "rc=$?"; fi

log "libxenvchan, 1 MiB rings: $BENCH_MIB MiB + $BENCH_PINGS round trips"
if XLBENCH_LABEL=vchan-1m xlbench vchan client "$PEER" "/local/domain/$PEER/data/bench-vchan1m" "$BENCH_MIB" "$BENCH_PINGS" 120; then
  result vchan-1m-client PASS
else result vchan-1m-client FAIL "rc=$?"; fi

log "AF_XEN (af_xen.ko) from C: $BENCH_MIB MiB + $BENCH_PINGS round trips"
irqs() { awk '/af_xen/ {n = 0; for (i = 2; i <= NF; i++) if ($i ~ /^[0-9]+$/) n += $i; else break; t += n} END {print t + 0}' /proc/interrupts; }
IRQ0=$(irqs)
if XLBENCH_LABEL=afxen timeout 300 xlbench-xs xen client "$PEER" 7301 "$BENCH_MIB" "$BENCH_PINGS" 120; then
  result afxen-client PASS
else result afxen-client FAIL "rc=$?"; fi
log "af_xen interrupts during the C AF_XEN run (client side): $(( $(irqs) - IRQ0 ))"

log "AF_XEN through libxensock (kernel backend)"
if XLBENCH_LABEL=afxen-libxensock timeout 300 lab_bench client kernel "$PEER" 7302 "$BENCH_MIB" "$BENCH_PINGS" 120; then
  result afxen-libxensock-client PASS
else result afxen-libxensock-client FAIL "rc=$?"; fi
# diagnostics (see domu1.sh): C client -> libxensock server, libxensock
# client -> C server, C -> C again
if XLBENCH_LABEL=afxen-c-to-rust timeout 200 xlbench-xs xen client "$PEER" 7304 "$BENCH_MIB" "$BENCH_PINGS" 120; then
  result afxen-c-to-rust-client PASS
else result afxen-c-to-rust-client FAIL "rc=$?"; fi
if XLBENCH_LABEL=afxen-rust-to-c timeout 200 lab_bench client kernel "$PEER" 7305 "$BENCH_MIB" "$BENCH_PINGS" 120; then
  result afxen-rust-to-c-client PASS
else result afxen-rust-to-c-client FAIL "rc=$?"; fi
if XLBENCH_LABEL=afxen-again timeout 200 xlbench-xs xen client "$PEER" 7306 "$BENCH_MIB" "$BENCH_PINGS" 120; then
  result afxen-again-client PASS
else result afxen-again-client FAIL "rc=$?"; fi
cat /proc/net/af_xen
check afxen-dmesg-clean sh -c '! dmesg | grep -E "BUG|Oops|WARNING|general protection|refcount_t"'
check afxen-rmmod rmmod af_xen

log "libxensock user-space transport over /dev/xen"
xlbench xsread data/bench-user-go 400 > /dev/null || log "no go from dom0 after 400 s"
if XLBENCH_LABEL=xensock-user timeout 300 lab_bench client user "$PEER" 7303 "$BENCH_MIB" "$BENCH_PINGS" 120; then
  result xensock-user-client PASS
else result xensock-user-client FAIL "rc=$?"; fi
