# kmod-leak, domu1: the server; reads every connection to EOF, then closes.
. /scenario/leak.sh
if [ "$LEAK_CORE" = 1 ]; then
  # the C suite's core: one-domain calls, loopback connections, and the
  # cross-domain cases with a checksummed 16 MiB stream each way
  run_c c-local local
  run_c c-loop loop
  if xstest-seqpacket seq-local; then result c-sp-seq-local PASS; else result c-sp-seq-local FAIL "rc=$?"; fi
  # the system-call fuzzer's findings, each as its minimal reproducer
  if xsrepro; then result c-repro PASS; else result c-repro FAIL "rc=$?"; fi
  xsrepro frozen-server 7400 &
  run_c c-xserver xserver 16
fi
xsleak server $PORT > /tmp/server.log 2>&1 &
SERVER=$!
# the baseline once domu2's warm-up connections are done (dom0 says when)
xlbench xsread data/leak-base 1200 >/dev/null
wait_until 70 settled
M0=$(memfree) G0=$(stat_of grants) X0=$(stat_of linger_expired)
log "baseline: MemFree $M0 KiB, grants $G0, linger_expired $X0"
echo "@@LEAK-BASE1"
# domu2's `xsleak stop` ends the server after the last pattern
wait $SERVER
# (its @@RESULT line reaches the console with the log)
cat /tmp/server.log
leak_back server "$M0" "$G0" "$X0"
head -n 12 /proc/net/af_xen_stats
echo "@@LEAK-END1"
# dom0 takes Xen's end count once both domUs are done
xlbench xsread data/leak-xen-end 1200 >/dev/null
leak_end
