# kmod, domu1: cross-domain server, module lifecycle, peer-domain death.
. /scenario/common.sh
check kmod-hostile-test-off sh -c 'test "$(cat /sys/module/af_xen/parameters/hostile_test)" = N'
# the fuzzer's frozen-ring reproducer: domu2 freezes a seqpacket
# connection to us, our recv must sleep (xsrepro.c)
xsrepro frozen-server 7400 &
# the cross-domain server: domu2's xstest xclient connects to it
run_c c-xserver xserver 64
# ring sizes, 4 MiB rings, SOCK_SEQPACKET (tests/lab/c/xstest_seqpacket.c)
for _m in seq-local server; do
  if xstest-seqpacket $_m; then result c-sp-$_m PASS; else result c-sp-$_m FAIL "rc=$?"; fi
done
dmesg | grep af_xen | tail -n 20
# examples/c/xen-echo.c, the README's program: its server here, domu2's
# client prints what came back
xen-echo server "$EXAMPLE_PORT" > /tmp/xen-echo.log 2>&1 &
XEN_ECHO=$!
# Debian's socat, unmodified, with its generic socket addresses
# (SOCKET-LISTEN:<family>:<protocol>:x<sockaddr after the family, hex>):
# domu2 sends a file, we compare it with the same pattern made here
xstest pattern-file /tmp/socat-want 8
check socat-recv-file sh -c "timeout 300 socat -u SOCKET-LISTEN:19:0:x0000$(le32 $SOCAT_PORT)ffffffff00000000 OPEN:/tmp/socat-got,creat,trunc && cmp /tmp/socat-want /tmp/socat-got && md5sum /tmp/socat-want /tmp/socat-got"
# domu2 ran the example before its socat, which has arrived: the server
# goes (its socket would keep rmmod below from unloading the module)
kill "$XEN_ECHO" 2>/dev/null
cat /tmp/xen-echo.log
# and back: we connect to domu2's socat listener (retried until it listens)
PEER=$(xlbench xsread data/peer 60)
check socat-send-file-back sh -c "n=0; while [ \$n -lt 120 ]; do socat -u OPEN:/tmp/socat-want SOCKET-CONNECT:19:0:x0000$(le32 $((SOCAT_PORT + 1)))$(le32 "$PEER")00000000 && exit 0; n=\$((n + 1)); sleep 1; done; exit 1"
# stress: STRESS_MIB both ways at once with random partial reads/writes,
# then STRESS_CONNS connections open at once, echoed through one epoll set
run_c c-stress sserver $STRESS_MIB $STRESS_CONNS
cat /proc/net/af_xen_stats
# a ring lent to a client that closes without a Close (domu2's test hook)
# is ended by the module's bound: linger_expired +1, grants back
run_c c-xlinger xlinger
# rmmod with an open socket is refused (the socket holds a module reference)
check kmod-rmmod-busy sh -c 'xstest hold 3 & sleep 1; if rmmod af_xen; then echo "rmmod succeeded with a socket open"; exit 1; fi; wait'
# rmmod with the link to domu2 up: retracts it (domu2 sees the link go down)
check kmod-rmmod rmmod af_xen
# loaded again: the link comes back (domu2 reloads too), for the death test
check kmod-reload sh -c "insmod $KO && test -d /sys/module/af_xen"
# domu2 opens an idle and a streaming connection to us, dom0 destroys
# domu2: both connections end with ECONNRESET, and the grants, mappings
# and irqs of the connections and of the link's peer half are given back
run_c c-xdeath xdeath
check kmod-rmmod-after-death rmmod af_xen
# socket(19, ...) with the module unloaded loads it by its alias net-pf-19
mkdir -p /lib/modules/$(uname -r)/extra
cp $KO /lib/modules/$(uname -r)/extra/
depmod
echo /bin/modprobe > /proc/sys/kernel/modprobe
check kmod-autoload sh -c 'xstest autoload && test -d /sys/module/af_xen'
# 100 loads and unloads with traffic in between: no leak (see churn.sh)
rmmod af_xen
if sh /scenario/churn.sh $KO 100 256 > /tmp/churn.log 2>&1; then result kmod-load-unload-100 PASS; else result kmod-load-unload-100 FAIL "$(tail -n 1 /tmp/churn.log)"; fi
cat /tmp/churn.log
check kmod-dmesg-clean dmesg_clean
dmesg | tail -n 30
