# kmod-leak, domu2: the connecting side, where the rings stayed granted.
# hostile_test: xstest xclient's hostile-peer cases corrupt our rings
. /opt/xensock/leak.env
[ "$LEAK_CORE" = 1 ] && KMOD_ARGS=hostile_test=1
. /scenario/leak.sh
PEER=$(xlbench xsread data/peer 60)
if [ "$LEAK_CORE" = 1 ]; then
  # the fuzzer's cross-domain reproducers (xsrepro.c)
  xsrepro connect-race "$PEER"
  xsrepro frozen-client "$PEER" 7400
  run_c c-xclient xclient "$PEER" 16
fi
log "peer domu1 is dom$PEER; $LEAK_CYCLES cycles per pattern in $LEAK_PROCS processes: $LEAK_PATTERNS"
# the first connection brings the link up; a few of each pattern warm
# the kernel's caches before the baseline
n=0
until xsleak client "$PEER" $PORT close 1 1 >/dev/null 2>&1; do
  n=$((n + 1)); [ $n -lt 300 ] || break; lab_sleep 1
done
for p in $LEAK_PATTERNS; do xsleak client "$PEER" $PORT "$p" 20 1 >/dev/null; done
wait_until 70 settled
M0=$(memfree) G0=$(stat_of grants) X0=$(stat_of linger_expired)
log "baseline: MemFree $M0 KiB, grants $G0, linger_expired $X0"
# dom0 counts Xen's grant frames and active entries now
echo "@@LEAK-BASE"
xlbench xsread data/leak-xen-base 300 >/dev/null
first=1
for p in $LEAK_PATTERNS; do
  xsleak client "$PEER" $PORT "$p" "$LEAK_CYCLES" "$LEAK_PROCS"
  leak_back "$p" "$M0" "$G0" "$X0"
  if [ $first = 1 ]; then
    # Xen's count after the first sequence: the grant table has grown to
    # what connections in flight at once need, and must grow no further
    echo "@@LEAK-MID"
    xlbench xsread data/leak-xen-mid 300 >/dev/null
    first=0
  fi
done
cat /proc/net/af_xen_stats | head -n 12
xsleak stop "$PEER" $PORT
wait_until 70 settled
echo "@@LEAK-END"
xlbench xsread data/leak-xen-end 1200 >/dev/null
leak_end
