# Load and unload af_xen.ko N times with loopback traffic in between
# (xstest churn: one connection, 1 MiB checked each way), then compare
# unreclaimable slab and vmalloc use with the start. Exit status 0 = no leak.
# Usage: sh churn.sh KO N TOLERANCE_KIB
KO=$1; N=$2; TOL=$3
meminfo() { awk -v k="$1:" '$1 == k {print $2}' /proc/meminfo; }
fail() { echo "churn: $*"; exit 1; }
one() {
  insmod "$KO" || fail "insmod failed at round $1"
  xstest churn || fail "loopback traffic failed at round $1"
  # the connection's rings and sockets are gone before the unload
  grep -q '^sockets 0$' /proc/net/af_xen_stats || fail "sockets left at round $1: $(cat /proc/net/af_xen_stats)"
  grep -q '^maps 0$' /proc/net/af_xen_stats || fail "mappings left at round $1"
  rmmod af_xen || fail "rmmod failed at round $1"
  ! grep -q af_xen /proc/interrupts || fail "irq left after rmmod at round $1"
}
# warm-up rounds (first-use allocations of the kernel), not counted
for i in 1 2 3 4 5; do one "w$i"; done
sync; echo 2 > /proc/sys/vm/drop_caches
s0=$(meminfo SUnreclaim); v0=$(meminfo VmallocUsed)
t0=$(date +%s)
i=1
while [ "$i" -le "$N" ]; do one "$i"; i=$((i + 1)); done
sync; echo 2 > /proc/sys/vm/drop_caches
s1=$(meminfo SUnreclaim); v1=$(meminfo VmallocUsed)
echo "churn: $N rounds in $(( $(date +%s) - t0 )) s; SUnreclaim ${s0} -> ${s1} kB, VmallocUsed ${v0} -> ${v1} kB (tolerance ${TOL} kB each)"
[ $((s1 - s0)) -le "$TOL" ] || fail "unreclaimable slab grew by $((s1 - s0)) kB"
[ $((v1 - v0)) -le "$TOL" ] || fail "vmalloc use grew by $((v1 - v0)) kB"
