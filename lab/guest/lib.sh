# Helpers for scenario scripts running inside the lab guests (busybox sh).
# Sourced by /init before it runs /scenario/<role>.sh, so every scenario
# script can use these functions. Everything a scenario reports reaches the
# host as marker lines on the console:
#
#   @@RESULT <check> PASS|FAIL|SKIP [detail]    one check
#   @@METRIC <name> <value> <unit>               one measurement
#   @@EXIT <rc>                                  the role script finished
#
# Markers must be printed at the start of a line; the host prefixes them
# with the guest name (dom0| domu1| domu2|) when it collects them.

LAB_ROLE=${LAB_ROLE:-unknown}
log()    { echo "lab[$LAB_ROLE] $*"; }
result() { echo "@@RESULT $1 $2${3:+ $3}"; }
metric() { echo "@@METRIC $1 $2 $3"; }

# check NAME CMD...   run CMD, report PASS/FAIL, show its output on failure.
check() {
  _name=$1; shift
  if _out=$("$@" 2>&1); then result "$_name" PASS
  else _rc=$?; echo "$_out" | tail -n 15 | sed "s/^/  [$_name] /"; result "$_name" FAIL "rc=$_rc"; fi
}

# lab_sleep SECONDS (fractions too): a sleep that starts no process, a
# builtin read timing out on a FIFO that nobody writes. Busybox's usleep
# and sleep are a fork and an exec each, which under TCG cost a PV guest
# milliseconds: dom0's polls below (several a second, for the whole run)
# took about a third of a CPU from the domUs being measured.
lab_sleep() {
  [ -p /tmp/lab-never ] || mkfifo /tmp/lab-never 2>/dev/null
  read -r -t "$1" _lab_sleep <> /tmp/lab-never || :
}

# stall_watch FILE SECS PROG...: run in the background until
# /tmp/stall-watch.stop (STALL_WATCH_STOP) exists, looking every 5 s
# (STALL_WATCH_STEP). Once FILE has not grown for SECS seconds,
# print twice, 5 s apart, where PROGs' threads sleep (state, wchan, the
# system call in progress: the lab kernel keeps no stacks), af_xen's
# connections, their carriers and legs (/proc/net/af_xen_tcp) and
# counters, and the TCP sockets' queues, then stop
# watching: a stream that stands still says who waits for what. Costs a
# `wc` every 5 s.
stall_watch() {
  case $#:${2:-} in
    [012]:*|*:|*:*[!0-9]*)
      echo "stall_watch: usage: stall_watch FILE SECS PROG... (SECS a whole number of seconds; got: $*)" >&2
      return 2 ;;
  esac
  _sw_file=$1 _sw_secs=$2; shift 2
  _sw_step=${STALL_WATCH_STEP:-5} _sw_stop=${STALL_WATCH_STOP:-/tmp/stall-watch.stop}
  _sw_last=-1 _sw_still=0
  while [ ! -e "$_sw_stop" ]; do
    lab_sleep "$_sw_step"
    _sw_now=$(wc -c < "$_sw_file" 2>/dev/null || echo 0)
    if [ "$_sw_now" != "$_sw_last" ]; then _sw_last=$_sw_now _sw_still=0; continue; fi
    _sw_still=$((_sw_still + _sw_step))
    [ "$_sw_still" -ge "$_sw_secs" ] || continue
    for _sw_look in 1 2; do
      log "stall: $_sw_file unchanged for $_sw_still s (look $_sw_look of 2)"
      for _sw_p in $(pidof "$@"); do
        for _sw_t in /proc/"$_sw_p"/task/*; do
          echo "  [stall] $(cat "$_sw_t/comm" 2>/dev/null) ${_sw_t#/proc/} state $(awk '{print $3}' "$_sw_t/stat" 2>/dev/null) wchan $(cat "$_sw_t/wchan" 2>/dev/null) syscall $(cut -d' ' -f1-4 "$_sw_t/syscall" 2>/dev/null)"
        done
      done
      sed 's/^/  [stall] /' /proc/net/af_xen /proc/net/af_xen_tcp /proc/net/af_xen_stats /proc/net/tcp 2>/dev/null
      lab_sleep "$_sw_step"
      _sw_still=$((_sw_still + _sw_step))
    done
    return 0
  done
}

# dmesg_clean [EXTRA_RE]: the kernel log has no BUG, Oops, WARNING, general
# protection fault, refcount_t report or leak message (nor EXTRA_RE); the
# debug kernel's "kmemleak: Kernel memory leak detector initialized" at
# boot is none of these. Prints what it found.
dmesg_clean() {
  ! dmesg | grep -v 'kmemleak: Kernel memory leak detector' |
    grep -E "BUG|Oops|WARNING|general protection|refcount_t|leak${1:+|$1}"
}

# wait_until TIMEOUT_S CMD...   retry CMD every 0.5 s until it succeeds.
wait_until() {
  _t=$(( $1 * 2 )); shift
  while ! "$@" >/dev/null 2>&1; do
    _t=$((_t - 1)); [ $_t -gt 0 ] || return 1; lab_sleep 0.5
  done
}

own_domid() { xenstore-read domid 2>/dev/null; }
uptime_s()  { cut -d' ' -f1 /proc/uptime; }

# Lab network (static; exists only inside the emulated machine).
LAB_NET_DOM0=10.0.0.1
LAB_NET_DOM0B=10.0.0.2      # host b's dom0 (two-host lab)
LAB_NET_DOMU1=10.0.0.11
LAB_NET_DOMU2=10.0.0.12

# ---- dom0 only: looking at the domUs --------------------------------------
# xenconsoled names the log after the domain when its console appears: a
# domain received by `xl migrate` starts as "<name>--incoming" and keeps
# writing that file after the rename, so a domU's console is both files.
domu_log() { echo "/var/log/xen/console/guest-$1.log"; }
# (set_domu_logs NAME sets DOMU_LOGS without the subshell of $(domu_logs))
set_domu_logs() { DOMU_LOGS="/var/log/xen/console/guest-$1.log /var/log/xen/console/guest-$1--incoming.log"; }
domu_logs() { set_domu_logs "$1"; echo "$DOMU_LOGS"; }
# wait_domu NAME REGEX TIMEOUT_S   wait until the domU's console shows REGEX.
# Each look is one grep (~30 ms of dom0's CPU under TCG: a fork and exec
# of busybox; with cat, a subshell and usleep it was ~75 ms): every 0.2 s
# for the first 2 s, every 0.5 s to 10 s, then every second, so that a
# wait across a whole benchmark round does not take the CPU the round's
# domUs are measured on.
wait_domu() {
  _left=$(( $3 * 10 )) _waited=0
  set_domu_logs "$1"
  # shellcheck disable=SC2086
  while ! grep -qsE "$2" $DOMU_LOGS; do
    [ $_left -gt 0 ] || return 1
    if [ $_waited -lt 20 ]; then _step=2; lab_sleep 0.2
    elif [ $_waited -lt 100 ]; then _step=5; lab_sleep 0.5
    else _step=10; lab_sleep 1; fi
    _left=$((_left - _step)) _waited=$((_waited + _step))
  done
}
# lines of the domU console log (for "did anything new appear since X")
domu_lines() { wc -l < "$(domu_log "$1")" 2>/dev/null || echo 0; }
# forward NAME: copy the domU's console log(s) to stdout, prefixed "NAME| ",
# as they grow. A dom0 scenario script that receives a domU (restore on the
# other host) starts one as `( forward NAME ) </dev/null >/dev/console 2>&1`,
# so the lines are not prefixed with its own name; the subshell matters (see
# tests/lab/twohost/dom0b.sh).
forward() {
  for _f in $(domu_logs "$1"); do forward_file "$1" "$_f" & done
}
# A forwarder that has passed a domU's @@EXIT line leaves
# /tmp/forwarded-exit.NAME (dom0-init waits for it before the reboot), and
# past its @@KERNEL-CHECKED line (debug kernel) /tmp/forwarded-checked.NAME.
# The first "@@XS-STUCK" line of a domU (xs_check: its XenStore does not
# answer) makes it run xs_report for that domU, then and there: what
# xenstored looks like while the guest waits on it.
# awk, not a shell loop: ash's `read` takes a line one byte, one system
# call, at a time, which in dom0 under TCG was milliseconds per line of
# every domU's console (lab_sleep has the measurement).
forward_file() {
  while [ ! -e "$2" ]; do lab_sleep 0.5; done
  tail -n +1 -F "$2" 2>/dev/null | awk -v name="$1" -v mark="/tmp/forwarded-exit.$1" '
    { gsub(/\r/, ""); print name "| " $0; fflush() }
    /^@@EXIT/ { printf "" > mark; close(mark) }
    /^@@KERNEL-CHECKED/ { m = "/tmp/forwarded-checked." name; printf "" > m; close(m) }
    /@@XS-STUCK/ && !reported { reported = 1; system(". /lab/lib.sh; xs_report " name) }'
}

# xs_report NAME (dom0): xenstored's side of a domU whose XenStore stands
# still. A dead xenstored hangs every guest request for good; a live one shows the
# domain's quota use (outstanding requests, watches, transactions) and
# whether it still answers dom0.
xs_report() {
  # (xl waits for a dead xenstored for good)
  _xr_d=$(timeout 5 xl domid "$1" 2>/dev/null)
  echo "lab[dom0] XenStore report for $1 (domid ${_xr_d:-?}), which says its XenStore does not answer:"
  if _xr_p=$(pidof xenstored); then
    echo "  xenstored (pid $_xr_p) runs: state, CPU ticks $(awk '{print $3, $14 + $15}' /proc/$_xr_p/stat 2>/dev/null)"
    timeout 10 xenstore-read "/local/domain/${_xr_d:-0}/name" >/dev/null 2>&1 &&
      echo "  it answers dom0" || echo "  it does not answer dom0 within 10 s"
    [ -z "$_xr_d" ] || timeout 10 xenstore-control quota "$_xr_d" 2>&1 | sed 's/^/  [quota] /'
    timeout 10 xenstore-control quota 2>&1 | sed 's/^/  [quota limits] /'
  else
    echo "  xenstored is NOT running; its output (without its verbose lines, which dom0 printed when it died):"
    grep -vE '^(Got message|Writing msg) ' /var/log/xen/xenstored.log 2>/dev/null | tail -n 20 | sed 's/^/  [xenstored] /'
    dmesg | grep -iE "xenstored|segfault|trap" | tail -n 5 | sed 's/^/  [dmesg] /'
  fi
  grep -v xenconsoled /var/log/syslog 2>/dev/null | tail -n 20 | sed 's/^/  [syslog] /'
  [ ! -f /var/log/xen/xenstored-trace.log ] ||
    tail -n 40 /var/log/xen/xenstored-trace.log | sed 's/^/  [xs-trace] /'
}

# xs_check WHO (domU): whether this domain's XenStore answers within 10 s,
# and where the kernel's xenbus and xenwatch threads are. If it does not
# answer, an "@@XS-STUCK" line asks dom0 for xs_report.
xs_check() {
  for _xc in /proc/[0-9]*/comm; do
    read -r _xc_n < "$_xc" 2>/dev/null || continue
    case $_xc_n in
      xenbus|xenwatch) _xc_t=${_xc%/comm}
        echo "  [$1 xenstore] $_xc_n state $(awk '{print $3}' "$_xc_t/stat") wchan $(cat "$_xc_t/wchan" 2>/dev/null)" ;;
    esac
  done
  if timeout 10 xenstore-read domid >/dev/null 2>&1; then log "$1: XenStore answers"
  else log "$1: XenStore does not answer within 10 s"; echo "@@XS-STUCK $1"; fi
}

# start_agent: dom0 runs xensock-agent (the domUs' co-residency tables and
# link directories; `xensock-agent away|back` later) as host "lab-a",
# AGENT its pid, its log /tmp/agent.log; our XenStore client talks to
# xenstored's socket. Checked as agent-running.
start_agent() {
  XENSTORED_PATH=/run/xenstored/socket
  [ -S $XENSTORED_PATH ] || XENSTORED_PATH=/var/run/xenstored/socket
  export XENSTORED_PATH
  xensock-agent --host-name lab-a > /tmp/agent.log 2>&1 &
  AGENT=$!
  sleep 1
  check agent-running kill -0 $AGENT
}

# mklink A B   stand in for the discovery agent: make domain A's link
# directory for B, /local/domain/A/data/xensock/link/B, owned by A and
# readable by B ("nA,rB"). A domU kernel cannot set XenStore permissions,
# so the directory comes from dom0. A node gets its parent's permissions
# when it is created, and the domU acts as soon as link/B appears, so
# link/B must be born with nA,rB (an agent does write+chmod in one
# transaction; the shell tools cannot): open the parent to B for the
# creation, then close it again. The dom0 initramfs has no xenstore-chmod,
# but the xenstore tools are one binary that dispatches on its name.
mklink() {
  ln -sf /usr/bin/xenstore-write /tmp/xenstore-chmod &&
  _l=/local/domain/$1/data/xensock/link &&
  xenstore-write "$_l" "" &&
  /tmp/xenstore-chmod "$_l" "n$1" "r$2" &&
  xenstore-write "$_l/$2" "" &&
  /tmp/xenstore-chmod "$_l/$2" "n$1" "r$2" &&
  /tmp/xenstore-chmod "$_l" "n$1"
}

# restore_as_new NAME OLD STAYER   (dom0) `xl restore` of /tmp/NAME.save,
# saved as domain OLD: checks xl-restore-NAME and new-domid-after-restore,
# sets NEW_DOMID ("none" if it is not there), and removes STAYER's link
# directory for OLD (the pair with the old domid ended, as the agent does).
restore_as_new() {
  check "xl-restore-$1" timeout 180 xl restore "/tmp/$1.save"
  rm -f "/tmp/$1.save"
  NEW_DOMID=$(xl domid "$1" 2>/dev/null || echo none)
  log "$1: dom$2 before save, dom$NEW_DOMID after restore"
  check new-domid-after-restore test "$NEW_DOMID" != none -a "$NEW_DOMID" != "$2"
  xenstore-rm "/local/domain/$3/data/xensock/link/$2" 2>/dev/null
}

# check_wait NAME PID [LOG]   wait for a background job of this shell and
# report it (its log's tail on failure). Start such jobs under `timeout`.
check_wait() {
  if wait "$2"; then result "$1" PASS
  else _rc=$?; [ -n "${3:-}" ] && tail -n 15 "$3" | sed "s/^/  [$1] /"; result "$1" FAIL "rc=$_rc"; fi
}
# watchdog PID SECS (shadows busybox's applet of that name): wait for
# PID; after SECS show where its threads sleep (a client once hung after
# printing "checksum OK"), kill -9 it. Its status.
watchdog() {
  _t=0
  while kill -0 $1 2>/dev/null && [ $_t -lt $2 ]; do sleep 1; _t=$((_t + 1)); done
  if kill -0 $1 2>/dev/null; then
    log "pid $1 still alive after $2 s:"
    for _k in /proc/$1/task/*; do echo "  [hang] $_k wchan=$(cat $_k/wchan 2>/dev/null) $(grep State $_k/status)"; done
    kill -9 $1; sleep 2
    kill -0 $1 2>/dev/null && { echo "  [hang] still there after SIGKILL: $(grep State /proc/$1/status)"; return 125; }
  fi
  wait $1
}
