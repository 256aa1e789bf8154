# bench, domu2: the client side, one transport at a time.
. /scenario/params.sh
PEER=$(xlbench xsread data/peer 60)

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

# ---- HOOK: xensock rows (see domu1.sh) -----------------------------------------
if [ -x /opt/xensock/bench/client ]; then
  log "xensock: $BENCH_MIB MiB + $BENCH_PINGS round trips"
  if /opt/xensock/bench/client "$PEER" "$LAB_NET_DOMU1" "$BENCH_MIB" "$BENCH_PINGS"; then result xensock-client PASS
  else result xensock-client FAIL "rc=$?"; fi
else
  result xensock-client SKIP "no /opt/xensock/bench/client yet (lab/run --guest-files DIR bench)"
fi
