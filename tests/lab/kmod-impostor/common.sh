# kmod-impostor: load af_xen.ko (sourced by domu*.sh). peer_lost_ms: a
# save under TCG takes ~13 s, and the stayer waits for the saved side.
KO=/opt/xensock/af_xen.ko
SV_PORT=7302
# the impostor's offers name connection ids 1..FORGED of domu2's
FORGED=64
check kmod-insmod insmod $KO peer_lost_ms=90000
run_c() {
  _n=$1; shift
  if xstest_migrate "$@"; then result "$_n" PASS; else result "$_n" FAIL "rc=$?"; fi
}
finish() {
  check kmod-rmmod rmmod af_xen
  check kmod-dmesg-clean sh -c '! dmesg | grep -E "BUG|Oops|WARNING|general protection|refcount_t|leak"'
  dmesg | grep -E "af_xen|BUG|WARNING|Oops" | tail -n 30
}
