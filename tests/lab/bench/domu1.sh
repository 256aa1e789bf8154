# bench, domu1: the server side of every transport. All servers wait idle
# until domu2 runs its clients one after another.
. /scenario/params.sh
PEER=$(xlbench xsread data/peer 60)
ME=$(own_domid)
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

# ---- HOOK: xensock rows ------------------------------------------------------
# Later issues drop their benchmark into the guests with
#   lab/run --guest-files DIR bench
# DIR/bench/server runs here (domu1) and DIR/bench/client in domu2, with
#   server: <peer-domid> <MiB> <N>      client: <server-domid> <server-ip> <MiB> <N>
# The client prints "@@METRIC xensock.stream_mib_s <v> MiB/s" and
# "@@METRIC xensock.rtt_us_{avg,p50,p99} <v> us" for the same workload as
# xlbench; the summary table then shows a xensock row next to tcp and vchan.
# The server starts only after the baselines are done, so it runs alone and
# has the domain's grant allowance to itself (gntalloc's default limit is
# 1024 pages per domain; two 1 MiB vchans already take all of it). The
# client must retry its connect for a while (xlbench waits up to 120 s).
if [ -x /opt/xensock/bench/server ]; then
  timeout 500 /opt/xensock/bench/server "$PEER" "$BENCH_MIB" "$BENCH_PINGS" > /tmp/xensock.log 2>&1 &
  XS=$!
  check_wait xensock-server "$XS" /tmp/xensock.log
  cat /tmp/xensock.log
fi
# -------------------------------------------------------------------------------
