# kmod-leak: what both domUs share (sourced by domu1.sh and domu2.sh).
KO=/opt/xensock/af_xen.ko
# LEAK_CYCLES, LEAK_PROCS, LEAK_PATTERNS, LEAK_CORE (scenario.conf, via
# scenario_build)
. /opt/xensock/leak.env
PORT=7300
# shellcheck disable=SC2086
check kmod-insmod insmod $KO ${KMOD_ARGS:-}
# run_c NAME ARGS...: xstest prints a @@RESULT c-* line per case; NAME
# sums them up from its exit status
run_c() {
  _n=$1; shift
  if xstest "$@"; then result "$_n" PASS; else result "$_n" FAIL "rc=$?"; fi
}
stat_of() { awk -v k="$1" '$1 == k {print $2}' /proc/net/af_xen_stats; }
# free memory (KiB) once the page cache is dropped: a ring the module
# still holds (granted, or pending until the peer unmaps it) is not free
memfree() { sync; echo 3 > /proc/sys/vm/drop_caches; awk '$1 == "MemFree:" {print $2}' /proc/meminfo; }
no_pending() { [ "$(stat_of grants_pending)" = 0 ]; }
# settled: no grant a peer still maps, and no ring lent to a peer whose
# Close is still on its way (the control ring can hold thousands of
# frames at the end of a run)
settled() { [ "$(stat_of grants_pending)" = 0 ] && [ "$(stat_of lingering)" = 0 ]; }
# mem_back BASE_KIB: free memory within LEAK_TOL_KIB of BASE_KIB (freed
# pages reach MemFree through the per-CPU lists: a few looks, 2 s apart)
LEAK_TOL_KIB=4096
mem_back() {
  _n=0
  while :; do
    LEAK_MEM=$(memfree)
    [ $(( $1 - LEAK_MEM )) -le $LEAK_TOL_KIB ] && return 0
    _n=$((_n + 1)); [ $_n -lt 15 ] || return 1
    lab_sleep 2
  done
}
# leak_back NAME BASE_KIB BASE_GRANTS BASE_EXPIRED: within 70 s (a lent
# ring's bound is 60 s) nothing pending or lent; then the module's grants
# back to BASE_GRANTS, no lent ring ended by the bound instead of the
# peer's Close (linger_expired still BASE_EXPIRED), and free memory back
# within LEAK_TOL_KIB (a connection's ring is 1 MiB) of BASE_KIB
leak_back() {
  check "leak-$1-no-pending" wait_until 70 settled
  _g=$(stat_of grants) _x=$(stat_of linger_expired)
  mem_back "$2"; _mok=$?
  log "leak $1: MemFree ${2} -> ${LEAK_MEM} KiB, grants ${3} -> ${_g}, linger_expired ${4} -> ${_x}, grants_pended $(stat_of grants_pended), sockets $(stat_of sockets)"
  metric "leak-$1-memfree-drop" $(( $2 - LEAK_MEM )) KiB
  if [ "$_g" = "$3" ] && [ "$_x" = "$4" ] && [ $_mok = 0 ]; then
    result "leak-$1-back" PASS
  else
    result "leak-$1-back" FAIL "MemFree $2 -> $LEAK_MEM KiB (tolerance $LEAK_TOL_KIB), grants $3 -> $_g, linger_expired $4 -> $_x"
  fi
}
leak_end() {
  check kmod-rmmod rmmod af_xen
  check kmod-dmesg-clean dmesg_clean "still pending|max_grant_frames"
  dmesg | grep -E "af_xen|grant" | tail -n 20
}
