# bench, domu2: the client side, one transport at a time, and AF_UNIX
# inside this domain (while domu1's servers idle in accept). The
# comparable transports run in BENCH_REPS interleaved rounds (host load
# under TCG swings several-fold within a run); lab/tools/bench-ratios
# reports the median of the rounds.
. /scenario/params.sh
PEER=$(xlbench xsread data/peer 60)
check afxen-insmod insmod /opt/xensock/af_xen.ko
xlbench-xs calib

# one check per transport over all rounds: FAIL names the failed rounds
FAILED=
run_client() { # NAME CMD...: one round's client, its output also in /tmp/clients.log
  _n=$1; shift
  # streamed as it comes: dom0 acts on the switch notes on the console
  { "$@"; echo $? > /tmp/run-client.rc; } 2>&1 | tee -a /tmp/clients.log
  _rc=$(cat /tmp/run-client.rc)
  [ "$_rc" = 0 ] || FAILED="$FAILED $_n:$ROUND:rc=$_rc"
}
# unchecked NAME CMD...: the same client once more, right after its
# checked run, the iperf way: the server reads the stream into the same
# 64 KiB buffer and does not compare it (XLBENCH_NOCHECK; row
# "<row>-unchecked", no round trips; domu1's serve_rounds ... unchecked)
unchecked() {
  _n=$1; shift
  run_client "$_n" env XLBENCH_NOCHECK=1 "$@"
}
if phase main; then # ---- the rounds of every transport, timed rows, iperf3, libxensock ----
for ROUND in $(seq "$BENCH_REPS"); do
  log "round $ROUND of $BENCH_REPS: $BENCH_MIB MiB + $BENCH_PINGS round trips per transport, then $BENCH_MIB MiB unchecked"
  timeout 300 xlbench-xs unix server /tmp/bench.sock "$BENCH_MIB" "$BENCH_PINGS" >> /tmp/unix.log 2>&1 &
  US=$!
  run_client unix-client xlbench-xs unix client /tmp/bench.sock "$BENCH_MIB" "$BENCH_PINGS" 30
  wait $US || FAILED="$FAILED unix-server:$ROUND"
  XLBENCH_NOCHECK=1 timeout 300 xlbench-xs unix server /tmp/bench.sock "$BENCH_MIB" 0 >> /tmp/unix.log 2>&1 &
  US=$!
  unchecked unix-unchecked-client xlbench-xs unix client /tmp/bench.sock "$BENCH_MIB" 0 30
  wait $US || FAILED="$FAILED unix-server:$ROUND-unchecked"
  run_client tcp-client xlbench tcp client "$LAB_NET_DOMU1" 7001 "$BENCH_MIB" "$BENCH_PINGS" 120
  unchecked tcp-unchecked-client xlbench tcp client "$LAB_NET_DOMU1" 7001 "$BENCH_MIB" 0 120
  run_client vchan-client xlbench vchan client "$PEER" "/local/domain/$PEER/data/bench-vchan-$ROUND" "$BENCH_MIB" "$BENCH_PINGS" 120
  unchecked vchan-unchecked-client \
    xlbench vchan client "$PEER" "/local/domain/$PEER/data/bench-vchan-$ROUND-u" "$BENCH_MIB" 0 120
  run_client vchan-1m-client env XLBENCH_LABEL=vchan-1m \
    xlbench vchan client "$PEER" "/local/domain/$PEER/data/bench-vchan1m-$ROUND" "$BENCH_MIB" "$BENCH_PINGS" 120
  unchecked vchan-1m-unchecked-client env XLBENCH_LABEL=vchan-1m \
    xlbench vchan client "$PEER" "/local/domain/$PEER/data/bench-vchan1m-$ROUND-u" "$BENCH_MIB" 0 120
  run_client afxen-client env XLBENCH_LABEL=afxen timeout 300 xlbench-xs xen client "$PEER" 7301 "$BENCH_MIB" "$BENCH_PINGS" 120
  unchecked afxen-unchecked-client env XLBENCH_LABEL=afxen timeout 300 xlbench-xs xen client "$PEER" 7301 "$BENCH_MIB" 0 120
  run_client afxen-1m-client env XLBENCH_LABEL=afxen-1m XLBENCH_BUF=1048576 \
    timeout 300 xlbench-xs xen client "$PEER" 7311 "$BENCH_MIB" "$BENCH_PINGS" 120
  unchecked afxen-1m-unchecked-client env XLBENCH_LABEL=afxen-1m XLBENCH_BUF=1048576 \
    timeout 300 xlbench-xs xen client "$PEER" 7311 "$BENCH_MIB" 0 120
  run_client afxen-128k-client env XLBENCH_LABEL=afxen-128k XLBENCH_BUF=131072 \
    timeout 300 xlbench-xs xen client "$PEER" 7331 "$BENCH_MIB" "$BENCH_PINGS" 120
  run_client afxen-1m-busy-client env XLBENCH_LABEL=afxen-1m-busy XLBENCH_BUF=1048576 XLBENCH_BUSY_POLL=1000 \
    timeout 300 xlbench-xs xen client "$PEER" 7321 "$BENCH_MIB" "$BENCH_PINGS" 120
  run_client afxen-1m-nocache-client env XLBENCH_LABEL=afxen-1m-nocache XLBENCH_BUF=1048576 XLBENCH_COPY=1 \
    timeout 300 xlbench-xs xen client "$PEER" 7341 "$BENCH_MIB" "$BENCH_PINGS" 120
done
for c in unix-server unix-client tcp-client vchan-client vchan-1m-client afxen-client afxen-1m-client afxen-128k-client afxen-1m-busy-client \
  afxen-1m-nocache-client unix-unchecked-client tcp-unchecked-client vchan-unchecked-client vchan-1m-unchecked-client \
  afxen-unchecked-client afxen-1m-unchecked-client; do
  bad=$(echo "$FAILED" | tr ' ' '\n' | grep "^$c:" | tr '\n' ' ')
  if [ -z "$bad" ]; then result $c PASS; else result $c FAIL "$bad"; fi
done
grep af_xen /proc/interrupts

log "AF_XEN timed rows (time_data_path on): where the time goes"
echo 1 > /sys/module/af_xen/parameters/time_data_path
# (not through check: its output, the metrics and cost lines, must reach the console)
if XLBENCH_LABEL=afxen-timed timeout 300 xlbench-xs xen client "$PEER" 7351 "$BENCH_MIB" "$BENCH_PINGS" 120; then
  result afxen-timed-client PASS
else result afxen-timed-client FAIL "rc=$?"; fi
if XLBENCH_LABEL=afxen-1m-timed XLBENCH_BUF=1048576 \
  timeout 300 xlbench-xs xen client "$PEER" 7361 "$BENCH_MIB" "$BENCH_PINGS" 120; then
  result afxen-1m-timed-client PASS
else result afxen-1m-timed-client FAIL "rc=$?"; fi
echo 0 > /sys/module/af_xen/parameters/time_data_path

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

log "AF_XEN through libxensock (kernel backend)"
if XLBENCH_LABEL=afxen-libxensock timeout 300 lab_bench client kernel "$PEER" 7302 "$BENCH_MIB" "$BENCH_PINGS" 120; then
  result afxen-libxensock-client PASS
else result afxen-libxensock-client FAIL "rc=$?"; fi
fi # phase main

# ---- af_xen.ko's TCP carrier against plain TCP, same phase ----------
# Each round: plain TCP over netfront (row tcp-same-phase), then an AF_XEN
# connection made on the ring; on its "switch-note tcpc-<round> ring-ok"
# dom0 removes the pair's link directories, the client waits until the
# connection's carrier is tcp both ways (/proc/net/af_xen) and streams
# over it (row afxen-tcp-carrier); "... end" tells dom0 to make the
# links again for the next round (and for what follows).
if phase tcp-carrier; then
log "TCP carrier phase: $BENCH_REPS rounds of tcp-same-phase and afxen-tcp-carrier ($BENCH_KTCPC)"
# the legs must be up within peer_lost_ms of the switch; under TCG 10 s is tight
echo 30000 > /sys/module/af_xen/parameters/peer_lost_ms
cat /proc/net/af_xen_stats > /tmp/stats-before-carrier
FAILED=
perf_start tcpc-client
# a round that stands still (once: 300 s until its timeout) shows why
rm -f /tmp/stall-watch.stop
stall_watch /tmp/clients.log 40 xlbench-xs xlbench &
STALL_WATCH=$!
for ROUND in $(seq "$BENCH_REPS"); do
  tcp_snap /tmp/tcp-counters
  # one look at the carriers mid-stream (what stall_watch would print)
  [ "$ROUND" = 1 ] && { lab_sleep 4; sed 's/^/  [af_xen_tcp round 1] /' /proc/net/af_xen_tcp; } &
  if [ "$BENCH_KTCPC" = paired ]; then
    # one client, both rows: its exit status is the pair's (the rows' own
    # verdicts are their metrics, below)
    run_client tcp-carrier-paired-client env XLBENCH_SWITCH_NOTE=tcpc-$ROUND XLBENCH_SEGMENTS=4 \
      XLBENCH_ROW_NODE=${BENCH_DOMCPU:+data/bench-row} \
      timeout 300 xlbench-xs paired client "$LAB_NET_DOMU1" 7002 "$PEER" 7371 "$BENCH_MIB" "$BENCH_PINGS" "$ROUND" 120
    tcp_delta "paired round $ROUND (sender, both rows)" /tmp/tcp-counters
  else
    run_client tcp-same-phase-client env XLBENCH_LABEL=tcp-same-phase \
      xlbench tcp client "$LAB_NET_DOMU1" 7002 "$BENCH_MIB" "$BENCH_PINGS" 120
    tcp_delta "tcp-same-phase round $ROUND (sender)" /tmp/tcp-counters
    tcp_snap /tmp/tcp-counters
    run_client afxen-tcp-carrier-client env XLBENCH_LABEL=afxen-tcp-carrier XLBENCH_SWITCH_NOTE=tcpc-$ROUND \
      timeout 300 xlbench-xs xen client "$PEER" 7371 "$BENCH_MIB" "$BENCH_PINGS" 120
    tcp_delta "afxen-tcp-carrier round $ROUND (sender)" /tmp/tcp-counters
  fi
  log "switch-note tcpc-$ROUND end"
  xlbench xsread data/tcpc-linked-$ROUND 120 > /dev/null || log "tcpc-$ROUND: no links from dom0 after 120 s"
done
# (BENCH_DOMCPU: dom0's `xlbench domcpu` prints its sums now)
[ -z "$BENCH_DOMCPU" ] || xenstore-write data/bench-row done
touch /tmp/stall-watch.stop
wait "$STALL_WATCH"
perf_report tcpc-client \
  "tcp-same-phase client" "$(perf_windows /tmp/clients.log 'xlbench tcp-same-phase client stream')" \
  "afxen-tcp-carrier client" "$(perf_windows /tmp/clients.log 'xlbench afxen-tcp-carrier client stream')"
if [ "$BENCH_KTCPC" = paired ]; then
  # a row passes when every round printed its stream and its round trips
  # (xlbench paired prints a row's metrics only if its stream arrived
  # intact, and the carrier's only if it stayed on tcp throughout)
  for row in tcp-same-phase afxen-tcp-carrier; do
    got=$(grep -c "^@@METRIC $row\.stream_mib_s" /tmp/clients.log)
    pings=$(grep -c "^@@METRIC $row\.rtt_us_batch" /tmp/clients.log)
    [ "$BENCH_PINGS" -gt 0 ] || pings=$BENCH_REPS
    if [ "$got" = "$BENCH_REPS" ] && [ "$pings" = "$BENCH_REPS" ]; then result $row-client PASS
    else result $row-client FAIL "$got streams and $pings round-trip sets of $BENCH_REPS rounds;$FAILED"; fi
  done
else
  for c in tcp-same-phase-client afxen-tcp-carrier-client; do
    bad=$(echo "$FAILED" | tr ' ' '\n' | grep "^$c:" | tr '\n' ' ')
    if [ -z "$bad" ]; then result $c PASS; else result $c FAIL "$bad"; fi
  done
fi
# the carrier's counters over the phase (frames, legs, switches; the
# data-path sums count ring work only)
cat /proc/net/af_xen_stats | paste -d' ' /tmp/stats-before-carrier - |
  awk '$1 == $3 && $4 != $2 { printf "  carrier phase: %s %+d\n", $1, $4 - $2 }'
check afxen-tcp-carrier-sockets-freed af_sockets_back_to "$(af_sockets /tmp/stats-before-carrier)"
fi # phase tcp-carrier
cat /proc/net/af_xen /proc/net/af_xen_stats
check afxen-dmesg-clean sh -c '! dmesg | grep -E "BUG|Oops|WARNING|general protection|refcount_t"'
check afxen-rmmod rmmod af_xen

phase user || exit 0
log "libxensock user-space transport over /dev/xen"
xlbench xsread data/bench-user-go 400 > /dev/null || log "no go from dom0 after 400 s"
if XLBENCH_LABEL=xensock-user timeout 300 lab_bench client user "$PEER" 7303 "$BENCH_MIB" "$BENCH_PINGS" 120; then
  result xensock-user-client PASS
else result xensock-user-client FAIL "rc=$?"; xs_check user-client; fi

# ---- the user-space transport's TCP carrier against plain TCP, same phase ----
# BENCH_REPS rounds in one process (lab_bench user-tcpc): plain TCP over
# netfront (row tcp-same-phase-user), then a connection made on the ring
# that the transport's suspend hook moves to its TCP carrier (row
# xensock-user-tcp-carrier; metrics only if it stayed on TCP and arrived
# intact); resume before the next round.
log "user-space TCP carrier phase: $BENCH_REPS rounds of tcp-same-phase-user and xensock-user-tcp-carrier ($BENCH_TCPC)"
perf_start user-tcpc-client
timeout "$TCPC_SECS" $BENCH_WRAP lab_bench client "$BENCH_TCPC" "$PEER" 7304 "$LAB_NET_DOMU1" 7004 "$BENCH_MIB" "$BENCH_PINGS" "$BENCH_REPS" 120 > /tmp/user-tcpc-client.log 2>&1
rc=$?
cat /tmp/user-tcpc-client.log
if [ $rc -eq 0 ]; then result xensock-user-tcp-carrier-client PASS
else result xensock-user-tcp-carrier-client FAIL "rc=$rc"; xs_check user-tcpc-client; fi
perf_report user-tcpc-client \
  "tcp-same-phase-user client" "$(perf_windows /tmp/user-tcpc-client.log 'lab_bench tcp-same-phase-user client stream')" \
  "xensock-user-tcp-carrier client" "$(perf_windows /tmp/user-tcpc-client.log 'lab_bench xensock-user-tcp-carrier client stream')"

