# The end-of-run check of a guest's kernel on the debug kernel
# (LAB_KERNEL=debug): sourced by /init in dom0 and the domUs after lib.sh.
#
# kernel_check NAME [domu]: reports, as @@RESULT lines,
#   kernel-rmmod     (a domU) once every process of the scenario is gone,
#                    af_xen.ko unloads within 90 s (SKIP where it was
#                    never loaded, or the scenario unloaded it)
#   kernel-kmemleak  kmemleak's scan after the unload finds no object that
#                    af_xen.ko allocated (other objects are counted, shown)
#   kernel-reports   the kernel log holds no report of a bug detector
# then prints @@KERNEL-CHECKED. Every report found is shown in full.

# What a detector prints first (KASAN and KFENCE begin "BUG: KASAN:",
# "BUG: KFENCE:"). SLUB's own reports begin "BUG <cache>
# (...): <what>"; lockdep's begin "WARNING: possible ..." and are caught
# by "WARNING:".
KERNEL_REPORT_RE='BUG:|BUG [a-z0-9_:-]+ [(]|WARNING:|UBSAN:|possible circular locking|possible recursive locking|inconsistent lock state|suspicious RCU usage|sleeping function called from invalid context|bad unlock balance|lock held when returning|DEBUG_LOCKS_WARN_ON|blocked for more than [0-9]+ seconds|soft lockup|hard LOCKUP|rcu_.* detected .*stall|general protection fault|Oops:|kernel BUG at|Kernel panic|ODEBUG:|list_add corruption|list_del corruption|refcount_t:|usercopy:|Unable to handle|Redzone overwritten|Poison overwritten|Object padding overwritten|Freepointer corrupt'

kernel_check() {
  _kc_name=$1
  mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
  if [ "${2:-}" = domu ]; then
    # Nothing of the scenario may hold a socket: everything but /init and
    # this shell goes, as at a shutdown; the module must then let go.
    kernel_check_stop_processes
    # (a ring a closed connection lent its peer keeps its socket, and so
    # the module, until the peer's Close or the 60 s bound)
    _kc_n=0
    if ! grep -q '^af_xen ' /proc/modules; then result kernel-rmmod SKIP "af_xen.ko not loaded"
    else
      until _kc_out=$(rmmod af_xen 2>&1); do
        _kc_n=$((_kc_n + 1)); [ $_kc_n -lt 45 ] || break; lab_sleep 2
      done
      if [ $_kc_n -lt 45 ]; then result kernel-rmmod PASS "after $((_kc_n * 2)) s"
      else
        result kernel-rmmod FAIL "$(echo "$_kc_out" | tr '\n' ' ') for 90 s, refcnt=$(cat /sys/module/af_xen/refcnt 2>/dev/null)"
        # what still holds it: the module's sockets and counters, and any
        # process left
        sed 's/^/  [af_xen] /' /proc/net/af_xen 2>/dev/null | head -n 40
        grep -E '^(sockets|grants|grants_pending|lingering|maps|evtchns) ' /proc/net/af_xen_stats 2>/dev/null | sed 's/^/  [af_xen_stats] /'
        ps 2>/dev/null | sed 's/^/  [ps] /'
      fi
    fi
  fi
  kernel_check_kmemleak
  # the log, whole: a report anywhere in the run counts
  dmesg > /tmp/kernel-check.log 2>&1
  _kc_hits=$(grep -cE "$KERNEL_REPORT_RE" /tmp/kernel-check.log)
  if [ "$_kc_hits" = 0 ]; then
    result kernel-reports PASS "$(wc -l < /tmp/kernel-check.log) log lines"
  else
    echo "lab[$_kc_name] kernel reports: $_kc_hits lines match; each with the 40 lines after it:"
    grep -nE "$KERNEL_REPORT_RE" /tmp/kernel-check.log | head -n 20 | sed 's/^/  [report] /'
    awk -v re="$KERNEL_REPORT_RE" '
      $0 ~ re && NR > until_line { until_line = NR + 40; shown++ }
      NR <= until_line && shown <= 5 { print "  [log] " $0 }' /tmp/kernel-check.log
    result kernel-reports FAIL "$_kc_hits report lines: $(grep -m1 -oE "$KERNEL_REPORT_RE" /tmp/kernel-check.log)"
  fi
  echo "@@KERNEL-CHECKED"
}

# Every process but /init (pid 1), this shell and its ancestors: TERM,
# then KILL what is left 5 s later.
kernel_check_stop_processes() {
  _kc_keep=" 1 $$ "
  _kc_p=$$
  while [ "$_kc_p" -gt 1 ]; do
    _kc_p=$(awk '{print $4}' /proc/$_kc_p/stat 2>/dev/null || echo 1)
    _kc_keep="$_kc_keep$_kc_p "
  done
  for _kc_sig in TERM KILL; do
    for _kc_d in /proc/[0-9]*; do
      _kc_p=${_kc_d#/proc/}
      case $_kc_keep in *" $_kc_p "*) continue ;; esac
      # kernel threads have an empty command line (procfs gives every
      # cmdline a size of 0: its content is what tells)
      [ -n "$(head -c 1 "$_kc_d/cmdline" 2>/dev/null | tr '\0' x)" ] || continue
      kill -s $_kc_sig "$_kc_p" 2>/dev/null
    done
    [ $_kc_sig = KILL ] || lab_sleep 5
  done
  lab_sleep 2
}

# kmemleak: two scans (an object is reported once it stayed unreferenced
# and unchanged across scans), then its list. An object is the module's if
# a frame of its allocation is in af_xen.ko: named "[af_xen]" while loaded,
# and after the unload a bare address in the module area
# (0xffffffffc0000000 and up), which nothing else loaded there leaves.
kernel_check_kmemleak() {
  _kc_kml=/sys/kernel/debug/kmemleak
  if [ ! -w $_kc_kml ]; then result kernel-kmemleak FAIL "no $_kc_kml (is debugfs mounted, kmemleak on?)"; return; fi
  echo scan > $_kc_kml; lab_sleep 6; echo scan > $_kc_kml
  cat $_kc_kml > /tmp/kmemleak.txt 2>&1
  awk '
    /^unreferenced object/ { if (obj != "") flush(); obj = $0; ours = 0; body = ""; next }
    obj != "" { body = body "\n" $0
      if ($0 ~ /\[af_xen\]/ || $0 ~ /\[<ffffffff[c-f][0-9a-f]+>\] 0xffffffff[c-f][0-9a-f]+/) ours = 1 }
    function flush() { n++; if (ours) { m++; if (m <= 5) print obj body } }
    END { if (obj != "") flush(); printf "@@KMEMLEAK %d %d\n", n + 0, m + 0 }' /tmp/kmemleak.txt > /tmp/kmemleak-ours.txt
  set -- $(tail -n 1 /tmp/kmemleak-ours.txt)
  if [ "$3" = 0 ]; then
    result kernel-kmemleak PASS "0 objects from af_xen.ko ($2 unreferenced objects elsewhere in the kernel)"
    [ "$2" = 0 ] || { echo "lab: kmemleak's objects not from af_xen.ko (first 3):"; grep -A14 -m3 '^unreferenced object' /tmp/kmemleak.txt | head -n 45 | sed 's/^/  [kmemleak] /'; }
  else
    sed '$d; s/^/  [kmemleak] /' /tmp/kmemleak-ours.txt
    result kernel-kmemleak FAIL "$3 objects from af_xen.ko ($2 in all)"
  fi
}
