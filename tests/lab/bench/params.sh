# Workload shared by every transport (xlbench, xlbench-xs, lab_bench): a BENCH_MIB MiB
# stream domu2 -> domu1, then BENCH_PINGS 1-byte round trips.
BENCH_MIB=64
BENCH_PINGS=500
# interleaved rounds of the comparable transports; bench-ratios takes medians
BENCH_REPS=3
IPERF_SECS=5
