# kmod-rust, domu2: the clients; each prints its own @@RESULT rust-* /
# tokio-* line per check (live on the console).
. /scenario/common.sh
PEER=$(xlbench xsread data/peer 60)
log "peer domu1 is dom$PEER"
if timeout 200 lab_kernel client "$PEER"; then result lab-kernel-client PASS
else result lab-kernel-client FAIL "rc=$?"; fi
if timeout 200 lab_tokio client "$PEER"; then result lab-tokio-client PASS
else result lab-tokio-client FAIL "rc=$?"; fi
cat /proc/net/af_xen
check dmesg-clean dmesg_clean
dmesg | grep af_xen | tail -n 20
