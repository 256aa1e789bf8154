# kmod: load af_xen.ko and run the single-domain C tests (sourced by domu*.sh).
KO=/opt/xensock/af_xen.ko
# KMOD_ARGS: module parameters of this guest (domu2: hostile_test=1)
# shellcheck disable=SC2086
check kmod-insmod insmod $KO ${KMOD_ARGS:-}
check kmod-family-sysfs sh -c 'test "$(cat /sys/module/af_xen/parameters/family)" = 19'
dmesg | grep -i af_xen
# run_c NAME ARGS...: the C tests print their own @@RESULT c-* line per case
# (straight to the console); NAME sums them up from the exit status.
run_c() {
  _n=$1; shift
  if xstest "$@"; then result "$_n" PASS; else result "$_n" FAIL "rc=$?"; fi
}
run_c c-local local
run_c c-loop loop
# the system-call fuzzer's findings, each as its minimal reproducer (the
# one-domain cases; the cross-domain ones in domu1.sh and domu2.sh)
if xsrepro; then result c-repro PASS; else result c-repro FAIL "rc=$?"; fi
# /proc/net/af_xen lists every socket (a held one shows up as UNBOUND);
# looked for for up to 20 s: a loaded debug guest can take seconds to start
# the holder
check kmod-proc sh -c 'xstest hold 30 & h=$!; i=0
  until grep -q "^UNBOUND" /proc/net/af_xen || [ $i -ge 200 ]; do sleep 0.1; i=$((i + 1)); done
  cat /proc/net/af_xen; grep -q "^UNBOUND" /proc/net/af_xen; r=$?; kill $h; wait; exit $r'
# le32 N: N as 4 little-endian bytes in hex (socat's generic socket addresses)
le32() { printf '%02x%02x%02x%02x' $(($1 & 255)) $(($1 >> 8 & 255)) $(($1 >> 16 & 255)) $(($1 >> 24 & 255)); }
SOCAT_PORT=7200
# examples/c/xen-echo.c
EXAMPLE_PORT=7210
# stress sizes: MiB each way at once, concurrent connections
STRESS_MIB=1024
STRESS_CONNS=1000
