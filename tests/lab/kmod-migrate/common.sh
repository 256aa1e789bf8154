# kmod-migrate: load af_xen.ko in test mode (sourced by domu*.sh). The TCP
# leg listener takes the default port (7919) and advertises eth0's address.
KO=/opt/xensock/af_xen.ko
LEG_PORT=7919
M_PORT=7300
# the move test (carrier switch to TCP and back)
MV_PORT=7301
# the save test (this connection follows domu1 through xl save + restore)
SV_PORT=7302
# the death test (domu2 destroyed with the connection on TCP)
DD_PORT=7303
# the close-first test (the server closes first with the connection on TCP)
CF_PORT=7304
DD_BOUND_MS=8000
# STREAM_MIB each way at once, a TCP leg opened at half of it
STREAM_MIB=32
# peer_lost_ms: a save under TCG takes ~13 s, and the stayer must wait for
# the saved side to come back (the default bound is 10 s)
check kmod-insmod insmod $KO hostile_test=1 peer_lost_ms=90000
check kmod-tcp-listener sh -c "dmesg | grep -q 'TCP leg listener on port $LEG_PORT' && grep -q '^tcp_port $LEG_PORT' /proc/net/af_xen_stats"
dmesg | grep -i af_xen
# The move test's reader pause (reader-pause-on-tcp) holds the sender's leg
# on a zero window for peer_lost_ms + 4 s: with a 6 s bound on both ends
# while it runs (the legs, made at its switch, take the bound then); the
# save test needs the long one back
mv_bound_on() { echo 6000 > /sys/module/af_xen/parameters/peer_lost_ms; }
mv_bound_off() { echo 90000 > /sys/module/af_xen/parameters/peer_lost_ms; }
run_c() {
  _n=$1; shift
  if xstest_migrate "$@"; then result "$_n" PASS; else result "$_n" FAIL "rc=$?"; fi
}
finish() {
  check kmod-rmmod rmmod af_xen
  check kmod-dmesg-clean dmesg_clean
  dmesg | grep -E "af_xen|BUG|WARNING|Oops" | tail -n 30
}
