# Workload shared by every transport (xlbench, xlbench-xs, lab_bench): a BENCH_MIB MiB
# stream domu2 -> domu1, then BENCH_PINGS 1-byte round trips.
BENCH_MIB=64
BENCH_PINGS=500
# interleaved rounds of the comparable transports; bench-ratios takes medians
BENCH_REPS=3
IPERF_SECS=5
# BENCH_ONLY (host environment, passed in /opt/xensock/bench.env by
# scenario_build): run one phase of the bench only -- "tcp-carrier" (issue
# #7's af_xen.ko TCP carrier against TCP in the same phase) or "user"
# (the user-space transport's phases); empty: everything. BENCH_REPS may be
# set the same way, and BENCH_PINGS (fewer round trips: more rounds in
# the same time, for stream ratios).
BENCH_ONLY=
# lab_bench's mode for the user-space carrier rows: user-tcpc-paired
# (both connections open, their streams sent in turns: the ratio is paired
# against the host's drift) or user-tcpc (one whole stream per row, with
# per-stream CPU lines and LAB_PERF windows)
BENCH_TCPC=user-tcpc-paired
# xlbench's mode for the af_xen.ko carrier rows: paired (the
# default: `xlbench paired`, the carrier connection and plain TCP open side
# by side, their streams sent in turns of a quarter, A-B-B-A) or rows (one
# whole stream per row, one client after the other, as before)
BENCH_KTCPC=paired
# BENCH_DOMCPU=1 (paired mode): dom0 sums every domain's CPU time as Xen
# counts it per row of the kernel carrier phase (`xlbench domcpu`; the
# paired client names each segment's row in domu2's data/bench-row): what
# dom0's netback spends on each row, which neither domU sees
BENCH_DOMCPU=
# BENCH_USER_PEERS=static (host environment, via bench.env): the
# user-space transport gets a static peer list (XENSOCK_PEERS), so it does
# not watch all of /local/domain
[ -f /opt/xensock/bench.env ] && . /opt/xensock/bench.env
# the client's limit for the user-space carrier phase (the server's is 100 s
# more): a round is ~6 s plus ~1.5 s per 100 round trips per row
TCPC_SECS=$((300 + BENCH_REPS * (8 + BENCH_PINGS / 25)))
# phase NAME: whether this run includes the phase NAME (main, tcp-carrier, user)
phase() { [ -z "$BENCH_ONLY" ] || [ "$BENCH_ONLY" = "$1" ]; }
# tcp_snap FILE / tcp_delta LABEL FILE: the kernel's TCP counters
# (/proc/net/snmp Tcp, /proc/net/netstat TcpExt) now, and one line of
# those that changed since the snapshot: segments, ACK kinds, windows,
# corking, coalescing, retransmissions, for comparing a transport's TCP
# with plain TCP's in the same round (what the carrier's ends wait for).
# The carrier's 1-byte round trips go out on one leg and come back on the
# other, so neither carries the other's ACK: each costs the sender one
# segment more in and one more out than TCP's (InSegs ~2030 against ~1430
# per round is the 500 round trips, not the stream).
tcp_snap() {
  awk '/^(Tcp|TcpExt):/ { k = $1; if (!(k in h)) { for (i = 2; i <= NF; i++) n[k, i] = $i; h[k] = 1 }
       else for (i = 2; i <= NF; i++) print n[k, i], $i }' /proc/net/snmp /proc/net/netstat > "$1"
  # and the packets the network devices moved (a GSO packet counts once:
  # how finely the stream was cut on its way to netback)
  awk -F'[: ]+' 'FNR > 2 && $2 != "lo" { print $2 "_rxpk", $4; print $2 "_txpk", $12 }' /proc/net/dev >> "$1"
}
tcp_delta() {
  tcp_snap "$2.now"
  awk -v l="$1" 'NR == FNR { a[$1] = $2; next }
    $1 ~ /^(InSegs|OutSegs|RetransSegs|DelayedACKs|TCPHPHits|TCPPureAcks|TCPHPAcks|TCPAutoCorking|TCPRcvCoalesce|TCPBacklogCoalesce|TCPOFOQueue|TCPToZeroWindowAdv|TCPWantZeroWindowAdv|TCPFromZeroWindowAdv|TCPWinProbe|TCPRcvQDrop|TCPSackRecovery|TCPLostRetransmit|TCPTimeouts|TCPDSACKRecv|TCPDelivered|[a-z0-9]+_(rx|tx)pk)$/ && $2 != a[$1] {
      out = out sprintf(" %s=%d", $1, $2 - a[$1]) }
    END { printf "  tcp counters %s:%s\n", l, out }' "$2" "$2.now"
}
# perf_start NAME / perf_report NAME LABEL WINDOWS LABEL WINDOWS: with
# LAB_PERF=1 on the host (perf in the domU root, BENCH_PERF in bench.env),
# a whole-domain profile by software clock (no PMU in the guests), stamped
# with CLOCK_MONOTONIC, reported for each LABEL's WINDOWS ("start,stop
# start,stop ...", from perf_windows) separately. Samples land where a PV
# guest re-enables interrupts (after a hypercall or a trapped clock read),
# so compare rows, not symbols within one.
# LAB_PERF=strace instead: the phase's program runs under strace -f -c
# (BENCH_WRAP), which counts every system call of every thread.
# LAB_PERF=ss: every 0.5 s, `ss -tinm` of the domain's established TCP
# sockets (windows, buffers, RTT, ACK timing of plain TCP and the legs).
perf_start() {
  PERF_PID=; BENCH_WRAP=
  if [ "${BENCH_PERF:-}" = strace ] && command -v strace > /dev/null; then
    BENCH_WRAP="strace -f -c -o /tmp/strace-$1.txt"
    return 0
  fi
  if [ "${BENCH_PERF:-}" = ss ] && command -v ss > /dev/null; then
    ( while :; do echo "@ $(cut -d' ' -f1 /proc/uptime)"; ss -tinmH state established; sleep 0.5; done ) > "/tmp/ss-$1.txt" 2>&1 &
    PERF_PID=$!
    return 0
  fi
  [ -n "${BENCH_PERF:-}" ] && command -v perf > /dev/null || return 0
  echo -1 > /proc/sys/kernel/perf_event_paranoid; echo 0 > /proc/sys/kernel/kptr_restrict
  perf record -q -g -k mono -e cpu-clock -F 999 -a -o "/tmp/perf-$1.data" > "/tmp/perf-$1.log" 2>&1 &
  PERF_PID=$!
}
# perf_windows FILE PREFIX: the windows of the lines "PREFIX window:
# monotonic start,stop" (lab_bench, xlbench) in FILE, space-separated
perf_windows() {
  sed -n "s/^$2 window: monotonic //p" "$1" | tr '\n' ' ' | sed 's/ *$//'
}
perf_report() {
  _name=$1; shift
  # strace writes its table when the process has exited
  [ -z "${BENCH_WRAP:-}" ] || wait_until 30 sh -c '! pidof strace' || true
  if [ -f "/tmp/strace-$_name.txt" ]; then
    echo "---- strace -f -c: $_name (every round, TCP and carrier) ----"
    cat "/tmp/strace-$_name.txt"
  fi
  [ -n "${PERF_PID:-}" ] || return 0
  if [ -f "/tmp/ss-$_name.txt" ]; then
    kill "$PERF_PID"; wait "$PERF_PID" 2>/dev/null
    echo "---- ss -tinm every 0.5 s: $_name (uptime stamps; the rows' windows: $2 / $4) ----"
    cat "/tmp/ss-$_name.txt"
    return 0
  fi
  kill -INT "$PERF_PID"; wait "$PERF_PID"; cat "/tmp/perf-$_name.log"
  while [ $# -ge 2 ]; do
    echo "---- perf profile: $1 (windows $2) ----"
    perf report -i "/tmp/perf-$_name.data" --time "$2" --stdio -n --no-children --sort comm,dso,sym \
      -g none --percent-limit 0.7 2>/dev/null | grep -v '^#' | grep -v '^$' | head -40
    echo "---- perf callers: $1 ----"
    perf report -i "/tmp/perf-$_name.data" --time "$2" --stdio -n --no-children \
      --sort comm,sym -g caller,0.5,callee,function,percent --percent-limit 2 2>&1 | grep -v '^#' | grep -v '^$' | head -400
    shift 2
  done
}

# af_xen's live sockets (/proc/net/af_xen_stats), and a check that they are
# back to what they were before a phase: a closed connection keeps its
# socket only while it still has something to send on its TCP leg, well
# under the phase's peer_lost_ms
af_sockets() { awk '$1 == "sockets" { print $2 }' "${1:-/proc/net/af_xen_stats}"; } # [STATS_FILE]
af_sockets_at_most() { [ "$(af_sockets)" -le "$1" ]; }
af_sockets_back_to() {
  wait_until 10 af_sockets_at_most "$1" && return 0
  echo "af_xen sockets: $(af_sockets) 10 s after the phase, $1 before it"
  return 1
}
