# kmod-rust, domu1: the servers (libxensock and tokio-xensock, both over
# af_xen.ko); domu2's clients stop them when they are done.
. /scenario/common.sh
timeout 240 lab_kernel server > /tmp/lab_kernel.log 2>&1 &
RS=$!
timeout 240 lab_tokio server > /tmp/lab_tokio.log 2>&1 &
TK=$!
check_wait rust-server $RS /tmp/lab_kernel.log
sed 's/^/  [lab_kernel server] /' /tmp/lab_kernel.log
check_wait tokio-server $TK /tmp/lab_tokio.log
sed 's/^/  [lab_tokio server] /' /tmp/lab_tokio.log
cat /proc/net/af_xen
check dmesg-clean dmesg_clean
dmesg | grep af_xen | tail -n 20
