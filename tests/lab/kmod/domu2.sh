# kmod, domu2: single-domain tests, the cross-domain client (with the
# hostile-peer test mode on), connects that stay pending, then the victim
# of the peer-death test: dom0 destroys this domain while it streams.
KMOD_ARGS=hostile_test=1
. /scenario/common.sh
PEER=$(xlbench xsread data/peer 60)
log "peer domu1 is dom$PEER"
# the fuzzer's cross-domain reproducers (xsrepro.c)
xsrepro connect-race "$PEER"
xsrepro frozen-client "$PEER" 7400
run_c c-xclient xclient "$PEER" 64
if xstest-seqpacket client "$PEER" 256; then result c-sp-client PASS; else result c-sp-client FAIL "rc=$?"; fi
# dom0 made a link directory to itself for us, and runs no module
run_c c-xpending xpending
# the README's C example (examples/c/xen-echo.c) against domu1's server,
# retried until it listens
check example-c-echo sh -c "n=0; while [ \$n -lt 120 ]; do out=\$(xen-echo client $PEER $EXAMPLE_PORT 2>&1) && [ \"\$out\" = hello ] && exit 0; n=\$((n + 1)); sleep 1; done; echo \"\$out\"; exit 1"
# socat (SOCKET-CONNECT to domu1's SOCKET-LISTEN) carries a file to domu1,
# which checks it; retried until domu1's socat listens
xstest pattern-file /tmp/socat-send 8
check socat-send-file sh -c "n=0; while [ \$n -lt 120 ]; do socat -u OPEN:/tmp/socat-send SOCKET-CONNECT:19:0:x0000$(le32 $SOCAT_PORT)$(le32 "$PEER")00000000 && exit 0; n=\$((n + 1)); sleep 1; done; exit 1"
# and back, domu1 -> us, compared with the pattern made here
check socat-recv-file-back sh -c "timeout 300 socat -u SOCKET-LISTEN:19:0:x0000$(le32 $((SOCAT_PORT + 1)))ffffffff00000000 OPEN:/tmp/socat-got,creat,trunc && cmp /tmp/socat-send /tmp/socat-got && md5sum /tmp/socat-send /tmp/socat-got"
# stress client (domu1 runs the server side)
run_c c-stress sclient "$PEER" $STRESS_MIB $STRESS_CONNS
# closes without a Close (hostile_test hook): domu1's lent ring hits its bound
run_c c-xlinger-client xlinger-client "$PEER"
# domu1 unloads its module after its tests: the link goes down here, with
# no socket left on it
check kmod-peer-unload-link-down wait_until 300 sh -c "dmesg | grep -q 'link to dom$PEER down'"
dmesg | grep af_xen | tail -n 20
check kmod-rmmod-domu2 rmmod af_xen
check kmod-dmesg-clean-domu2 dmesg_clean
dmesg | tail -n 20
check kmod-reload-domu2 insmod $KO
# the victim outlives this script (this domain stays up after @@EXIT);
# dom0 destroys the domain once domu1 reports c-xd-ready
xstest xvictim "$PEER" &
sleep 1
