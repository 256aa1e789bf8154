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
# The shared behaviour cases of libxensock's and tokio-xensock's test
# suites (each crate's tests/cases/, the bodies their sim tests run) over
# the kernel family: loopback connections in this domain. One @@RESULT per
# libtest case (kfam-<name>, tfam-<name>); NAME sums up the exit status.
run_cases() {
  _n=$1 _p=$2 _bin=$3
  timeout 300 "$_bin" --ignored --test-threads=1 > "/tmp/$_n.log" 2>&1
  _rc=$?
  sed 's/^/  ['"$_n"'] /' "/tmp/$_n.log"
  sed -n 's/^test \([a-z0-9_]*\) \.\.\. \(ok\|FAILED\)$/\1 \2/p' "/tmp/$_n.log" |
    while read -r _t _r; do
      if [ "$_r" = ok ]; then result "$_p-$_t" PASS; else result "$_p-$_t" FAIL "see the $_n log above"; fi
    done
  if [ $_rc -eq 0 ]; then result "$_n" PASS; else result "$_n" FAIL "rc=$_rc"; fi
}
run_cases kernel-family-tests kfam kernel_family
run_cases tokio-kernel-family-tests tfam tokio_kernel_family
cat /proc/net/af_xen_stats
check dmesg-clean dmesg_clean
dmesg | grep af_xen | tail -n 20
