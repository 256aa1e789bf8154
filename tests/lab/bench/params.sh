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
# set the same way.
BENCH_ONLY=
[ -f /opt/xensock/bench.env ] && . /opt/xensock/bench.env
# phase NAME: whether this run includes the phase NAME (main, tcp-carrier, user)
phase() { [ -z "$BENCH_ONLY" ] || [ "$BENCH_ONLY" = "$1" ]; }
