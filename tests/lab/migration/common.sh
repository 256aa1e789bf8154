# Migration scenarios (migration in the lab), shared by both domUs: see
# docs/lab.md "Migration scenarios". Sourced by domu1.sh / domu2.sh.
# /opt/xensock/migration.params (written by scenario_build): MIG_STACK
# (kmod | userspace | mixed) and MIG_MOVES (saverestore away migrate, in
# order).
. /opt/xensock/migration.params
# this guest's stack: mixed puts af_xen.ko in MIG_MIXED_KMOD (domu1 by
# default) and the user-space transport in the other
GUEST_STACK=$MIG_STACK
if [ "$MIG_STACK" = mixed ]; then
  if [ "$LAB_ROLE" = "${MIG_MIXED_KMOD:-domu1}" ]; then GUEST_STACK=kmod; else GUEST_STACK=userspace; fi
fi
[ "${MIG_XS_ET:-0}" = 1 ] && export XSSTREAM_ET=1
[ "${MIG_TOKIO_THREADS:-0}" = 1 ] && export LAB_STREAM_THREADS=1
[ "${MIG_PROBE:-0}" = 1 ] && export LAB_STREAM_PROBE=1
. /scenario/streams.sh
# A guest stuck in its suspend path (docs/lab.md, "Guests that never
# suspend") has its user space frozen, so nobody can run dmesg; the lab
# kernel reports tasks blocked for 20 s (CONFIG_DETECT_HUNG_TASK), but
# their stacks are KERN_INFO, below the console's loglevel=4: let them out.
echo 7 > /proc/sys/kernel/printk 2>/dev/null || log "could not raise the console loglevel"

# lab_note KEY [VALUE]: tell dom0 (data/lab/KEY in our current home)
lab_note() { xenstore-write "data/lab/$1" "${2:-1}"; }
# lab_wait KEY TIMEOUT_S: until dom0 wrote data/lab/KEY in our home; prints it
lab_wait() {
  wait_until "$2" xenstore-read "data/lab/$1" || { log "dom0 never wrote data/lab/$1 (${2}s)"; return 1; }
  xenstore-read "data/lab/$1"
}

move_index() { case $1 in saverestore) echo 0 ;; away) echo 1 ;; migrate) echo 2 ;; churn) echo 3 ;; bothsave) echo 4 ;; esac; }
# streams of a stack: kx = C xsstream over AF_XEN, kt = tokio over the
# kernel family, ut = tokio over the user-space transport, mt = tokio over
# whichever each end has (mixed: the kernel family at one end, the
# user-space transport at the other), tcp = C xsstream over TCP between
# the same two domUs (the baseline: it must pass whatever xensock does)
streams() {
  if [ -n "${MIG_STREAMS:-}" ]; then echo "$MIG_STREAMS"
  elif [ "$MIG_STACK" = kmod ]; then echo "kx kt tcp pre"
  elif [ "$MIG_STACK" = mixed ]; then echo "mt tcp"; else echo "ut tcp"; fi
}
stream_port() {
  _b=7500; case $1 in kt) _b=7510 ;; tcp) _b=7520 ;; ut) _b=7530 ;; pre) _b=7540 ;; mt) _b=7550 ;; esac
  echo $((_b + $(move_index "$2")))
}
# the check name prefix the program prints (@@RESULT c-... / tokio-...)
stream_prefix() { case $1 in kt|ut|mt) echo tokio ;; *) echo c ;; esac; }
is_xen_stream() { [ "$1" != tcp ]; }

# ---- one listener for the whole run (kernel stack) ------------------------------
# domu1 makes ONE AF_XEN listener before the first move (`xsstream echo`);
# after each move domu2 finds domu1's current domid by its address
# (`xensock-discover resolve`, as a C program would) and connects to that
# old listener: the "listeners survive their guest's move;
# connections to a moved domain resolve through UUID or IP".
ECHO_PORT=7600
has_listener_check() { [ "$MIG_STACK" = kmod ]; }
start_echo_listener() {
  xsstream echo "$ECHO_PORT" > /tmp/echo.log 2>&1 &
  ECHO_PID=$!
}
# listener_check MOVE DOMID: DOMID is domu1's current domid as dom0 saw it
listener_check() {
  has_listener_check || return 0
  _res=$(xensock-discover resolve "$LAB_NET_DOMU1" 2>&1); _rc=$?
  if [ "$_rc" = 0 ] && [ "$_res" = "$2" ]; then
    result "resolve-$1" PASS "dom$_res"
  else
    result "resolve-$1" FAIL "resolve $LAB_NET_DOMU1 gave '$_res' (exit $_rc), dom0 says dom$2"
  fi
  # the same through af_xen.ko, as an unprivileged program (the preload
  # library's question), and an address no guest has
  _res=$(runas "$UT_UID" xsstream resolve "$LAB_NET_DOMU1" 2>&1); _rc=$?
  if [ "$_rc" = 0 ] && [ "$_res" = "$2" ]; then
    result "kresolve-$1" PASS "dom$_res"
  else
    result "kresolve-$1" FAIL "XENSOCK_IOC_RESOLVE $LAB_NET_DOMU1 gave '$_res' (exit $_rc), dom0 says dom$2"
  fi
  _res=$(runas "$UT_UID" xsstream resolve 10.0.0.99 2>&1); _rc=$?
  if [ "$_rc" = 1 ] && [ "$_res" = EHOSTUNREACH ]; then
    result "kresolve-unknown-$1" PASS
  else
    result "kresolve-unknown-$1" FAIL "XENSOCK_IOC_RESOLVE 10.0.0.99 gave '$_res' (exit $_rc)"
  fi
  # the domid dom0 gave, so a resolve failure does not hide the listener's fate
  check "listener-survives-$1" xsstream ping "$2" "$ECHO_PORT" "after-$1-from-domu2"
  preload_check "$1" "$2"
}

# The preload library with programs nobody here wrote: Debian's socat, run
# unprivileged as a TCP program would be. domu1 serves TCP port DUAL_PORT
# with socat under the library (start_dual_listener): its listening socket
# becomes the dual listener, taking co-resident clients over AF_XEN and
# everyone else over TCP. After each move, domu2 (preload_check MOVE DOMID)
# connects socat under the library to domu1's address: at ECHO_PORT (the
# AF_XEN echo listener) and at DUAL_PORT, both redirected to AF_XEN; and a
# socat without the library to DUAL_PORT, over TCP. Each echo must come
# back whole, and the library's decision log say which way it went.
DUAL_PORT=7700
PRELOAD_LIB=/opt/xensock/lib/libxensock_preload.so
preloaded() { runas "$UT_UID" env LD_PRELOAD=$PRELOAD_LIB XENSOCK_PRELOAD_LOG=1 "$@"; }
start_dual_listener() {
  # -d -d: each connection accepted and each child forked, with its time.
  # -t 30: once the client's end is at EOF, each child waits up to 30 s for
  # `cat`'s echo (socat's default, 0.5 s, was shorter than exec'ing cat
  # under the library takes on the debug kernel with the migration streams
  # running: the child closed before cat wrote, the client got no echo)
  preloaded socat -d -d -t 30 "TCP-LISTEN:$DUAL_PORT,fork,reuseaddr" EXEC:cat 2> /tmp/dual.err &
  DUAL_PID=$!
}
# echo_via NAME PORT PRELOAD(1|0) WANT_LOG: one line through socat. The
# client waits up to 30 s for the echo once it has sent its line (-t), as
# the dual listener's children wait for theirs (start_dual_listener)
echo_via() {
  _want="$1-$(date +%s)"
  if [ "$3" = 1 ]; then
    _got=$(echo "$_want" | preloaded socat -t 30 - "TCP:$LAB_NET_DOMU1:$2" 2> /tmp/preload.err)
  else
    _got=$(echo "$_want" | runas "$UT_UID" socat -t 30 - "TCP:$LAB_NET_DOMU1:$2" 2> /tmp/preload.err)
  fi
  _rc=$?
  sed "s/^/  [$1] /" /tmp/preload.err
  if [ "$_rc" = 0 ] && [ "$_got" = "$_want" ] && { [ -z "$4" ] || grep -q "$4" /tmp/preload.err; }; then
    result "$1" PASS "${4:-over TCP, no library}"
  else
    result "$1" FAIL "socat exit $_rc, echo '$_got' (sent '$_want'); log: $(tail -n 1 /tmp/preload.err)"
  fi
}
preload_check() {
  echo_via "preload-$1" "$ECHO_PORT" 1 "AF_XEN to dom$2 port $ECHO_PORT"
  echo_via "preload-dual-$1" "$DUAL_PORT" 1 "AF_XEN to dom$2 port $DUAL_PORT"
  echo_via "preload-dual-tcp-$1" "$DUAL_PORT" 0 ""
}

# ---- setup and teardown --------------------------------------------------------
# the user the user-space streams run as (streams.sh); the suspend hook
# runs as root
UT_UID=1000
mig_setup() {
  # the user-space transport's link and carrier events, on the console
  [ "$GUEST_STACK" = userspace ] && export RUST_LOG=libxensock=info
  if [ "$GUEST_STACK" = userspace ]; then
    # what a udev rule giving a group the devices would do, and a /tmp
    # every user may write
    chmod 0666 /dev/xen/gntdev /dev/xen/gntalloc /dev/xen/evtchn /dev/xen/xenbus
    chmod 1777 /tmp
  fi
  if [ "$GUEST_STACK" = kmod ]; then
    check kmod-insmod insmod /opt/xensock/af_xen.ko
    log "af_xen family $(cat /sys/module/af_xen/parameters/family 2>&1)"
    set_peer_lost
  fi
  # advertise (again after every move: the new home starts empty); the agent
  # in dom0 then lists the peers and makes the link directories
  xensock-discover advertise --keep --addr "$MY_IP" > /tmp/advertise.log 2>&1 &
  ADV=$!
  check advertise wait_until 30 xenstore-read data/xensock/addrs
  [ "$LAB_ROLE" = domu1 ] && has_listener_check && start_echo_listener && start_dual_listener
}
mig_finish() {
  kill "$ADV" 2>/dev/null
  if [ -n "${ECHO_PID:-}" ]; then
    kill "$ECHO_PID" 2>/dev/null
    sed "s/^/  [echo] /" /tmp/echo.log
  fi
  if [ -n "${DUAL_PID:-}" ]; then
    # where the dual listener's processes wait (a listener that took no
    # connection after a move shows it here)
    for _p in $(grep -lx socat /proc/[0-9]*/comm 2>/dev/null | cut -d/ -f3); do
      echo "  [dual] socat $_p: $(tr '\0' ' ' < /proc/$_p/cmdline) wchan $(cat /proc/$_p/wchan 2>/dev/null)"
      sed "s/^/  [dual]   /" /proc/$_p/stack 2>/dev/null
    done
    kill "$DUAL_PID" 2>/dev/null
    sed "s/^/  [dual] /" /tmp/dual.err
    check preload-dual-listener grep -q "on 0.0.0.0:$DUAL_PORT: TCP clients and co-resident" /tmp/dual.err
  fi
  if [ "$GUEST_STACK" = kmod ]; then
    head -n 40 /proc/net/af_xen; cat /proc/net/af_xen_stats
    check kmod-dmesg-clean dmesg_clean
    dmesg | grep -E "af_xen|BUG|WARNING|Oops" | tail -n 30
  fi
}

# ---- the user-space transport's migration hook ----------------------------------
# A PV guest's processes are frozen through its suspend, and grant mappings
# do not survive a save (a domU restored with gntdev mappings of its peer's
# pages oopsed in the lab): the guest's suspend path runs `xensock suspend`
# (every transport of the domain leaves its rings and releases every grant,
# mapping and event channel), the resume path `xensock resume`. Here dom0
# asks for both around xl save/restore and xl migrate (MIG_HOOK=0: not).
uses_hook() { [ "$GUEST_STACK" = userspace ] && [ "${MIG_HOOK:-1}" = 1 ]; }
# no grant page mapped (gntdev) or granted (gntalloc) by any process, and no
# user event channel bound (the evtchn driver names those "evtchn:<comm>")
nothing_shared() {
  _m=$(cat /proc/[0-9]*/maps 2>/dev/null | grep -c -E '/dev/xen/(gntdev|gntalloc)')
  _e=$(grep -c 'evtchn:' /proc/interrupts)
  echo "gntdev/gntalloc mappings $_m, user event channels $_e"
  [ "$_m" = 0 ] && [ "$_e" = 0 ]
}
suspend_hook() {
  lab_wait "$1-suspend" 900 >/dev/null
  _t0=$(uptime_s)
  xensock suspend 2>&1 | sed "s/^/  [xensock suspend] /"
  metric "$1.suspend_hook_s" "$(awk -v a="$_t0" -v b="$(uptime_s)" 'BEGIN{printf "%.2f", b-a}')" s
  check "$1-suspend-releases" nothing_shared
  lab_note "$1-suspended"
  lab_wait "$1-resume" 900 >/dev/null
  xensock resume 2>&1 | sed "s/^/  [xensock resume] /"
  lab_note "$1-resumed"
}

# pause_metrics MOVE: each stream's longest silence as this side received
# it (<role>_gap_s) and what the move added beyond the guest's own
# downtime, which dom0 notes (xl save + restore; the whole live migration;
# 0 for away): <role>_added_s. Shown in the run's METRICS table.
pause_metrics() {
  _down=$(xenstore-read "data/lab/$1-downtime" 2>/dev/null || echo 0)
  for s in $(streams); do
    _gap=$(awk '{print $6; exit}' "/tmp/$s-$1.status" 2>/dev/null)
    [ -n "$_gap" ] || continue
    metric "$s-$1.${LAB_ROLE}_gap_s" "$_gap" s
    metric "$s-$1.${LAB_ROLE}_added_s" "$(awk -v g="$_gap" -v d="$_down" 'BEGIN{a = g - d; printf "%.2f", a < 0 ? 0 : a}')" s
  done
}

# kmod_trace: the module's lines of dmesg since the last call, and its
# counters (what the switch did in this phase, not just its last 30 lines)
KMSG_SEEN=0
kmod_trace() {
  [ "$GUEST_STACK" = kmod ] || return 0
  dmesg | grep -E "af_xen|BUG|Oops|WARNING" > /tmp/kmsg.now
  _n=$(wc -l < /tmp/kmsg.now)
  tail -n +$((KMSG_SEEN + 1)) /tmp/kmsg.now | tail -n 150 | sed "s/^/  [dmesg $1] /"
  KMSG_SEEN=$_n
  sed "s/^/  [stats $1] /" /proc/net/af_xen_stats
}

# /proc/net/af_xen names every socket under this domain's current domid
# (it showed the pre-move one: the socket's stored address is from
# bind/connect time)
proc_own_domid() {
  awk -v me="$(own_domid)" 'NR > 1 { split($2, a, ":"); if (a[1] != "*" && a[1] != me) { print "not dom" me ": " $0; bad = 1 } }
    END { exit bad }' /proc/net/af_xen
}

# churn_cycles ROLE: dom0's MIG_CHURN away/back cycles under this phase's
# streams. Each cycle: dom0 sets data/lab/churn to away-<i>; every AF_XEN
# stream here shows carrier tcp; we set data/lab/churn-ack to tcp-<i>; dom0
# sets churn to back-<i>; every stream shows its ring again; we ack
# ring-<i>. A stream that does not
# switch within CARRIER_WAIT s ends the cycles (churn-failed). The streams'
# own verdicts at the stop say whether every byte arrived intact.
churn_cycles() {
  _cn=$MIG_CHURN; _i=1; _bad=; _ok=0
  # MIG_SAMPLE=1: every 0.5 s, each AF_XEN stream's /proc/net/af_xen row
  # and the TCP legs' /proc/net/tcp rows (queues, timer: 1 retransmit,
  # 4 zero-window probe), printed at the end (where a stream stands still)
  if [ "${MIG_SAMPLE:-0}" = 1 ] && [ "$GUEST_STACK" = kmod ]; then
    ( _last=; _same=0
      while :; do
        echo "t $(uptime_s)"
        grep ESTABLISHED /proc/net/af_xen
        awk 'NR > 1 && ($2 ~ /:1EEF$/ || $3 ~ /:1EEF$/) { print "tcp", $2, $3, $4, $5, $6, $7 }' /proc/net/tcp
        # a tokio stream whose bytes_in stands still for two samples: where its
        # threads are (stream_stacks: state, wchan, syscall, kernel stack)
        _in=$(awk -v p=":$(stream_port kt churn)\$" '$1 == "ESTABLISHED" && ($2 ~ p || $3 ~ p) { print $8 }' /proc/net/af_xen)
        if [ -n "$_in" ] && [ "$_in" = "$_last" ]; then _same=$((_same + 1)); else _same=0; fi
        _last=$_in
        if [ "$_same" = 2 ]; then
          echo "kt bytes_in $_in still: stacks"; rm -f /tmp/kt-churn.stacks; stream_stacks kt-churn
        fi
        lab_sleep 0.5
      done > /tmp/churn-sample.log 2>&1 ) &
    _sampler=$!
  fi
  : > /tmp/churn-tcp.s; : > /tmp/churn-ring.s
  while [ $_i -le "$_cn" ] && [ -z "$_bad" ]; do
    churn_half "away-$_i" '^tcp(/tcp)?$' "tcp-$_i" tcp || break
    churn_half "back-$_i" '^ring(-xen)?(/ring)?$' "ring-$_i" "a ring" || break
    _ok=$_i
    [ $((_i % 10)) = 0 ] && log "churn: $_i of $_cn cycles; $(for s in $(streams); do printf '%s got %s  ' "$s" "$(got "$s-churn")"; done)"
    _i=$((_i + 1))
  done
  [ -n "$_bad" ] && { lab_note churn-failed "$_bad"; log "churn: $_bad"; kmod_trace churn-failed; }
  if [ -n "${_sampler:-}" ]; then
    kill "$_sampler"; head -n 1 /proc/net/af_xen; sed "s/^/  [sample] /" /tmp/churn-sample.log
  fi
  for f in tcp ring; do
    sort -n "/tmp/churn-$f.s" | awk -v f="$f" -v r="$LAB_ROLE" '{ v[NR] = $1 } END {
      if (NR) printf "@@METRIC churn.%s_to_%s_p50_s %s s\n@@METRIC churn.%s_to_%s_max_s %s s\n", r, f, v[int((NR + 1) / 2)], r, f, v[NR] }'
  done
  for s in $(streams); do
    is_xen_stream "$s" || continue
    if [ -z "$_bad" ]; then result "$s-churn-every-cycle" PASS "$_ok of $_cn cycles: to tcp and back to the ring"
    else result "$s-churn-every-cycle" FAIL "$_ok of $_cn cycles, then: $_bad"; fi
    switches_at_least "$s-churn" "$(stream_port "$s" churn)" $((2 * _ok)) "$s-churn-switches"
  done
  for s in $(streams); do flowing "$s-churn" "$s-churn-flows-after" || true; done
  [ "$_role" = client ] && listener_check churn "$PEER"
  kmod_trace churn
}
# churn_half STEP REGEX ACK WHAT: half a cycle. Once dom0 set STEP (e.g.
# away-3), every AF_XEN stream's carrier must match REGEX (WHAT in the
# failure); the time that took goes to /tmp/churn-<ACK's kind>.s and ACK
# (e.g. tcp-3) to dom0. On failure sets _bad and fails.
churn_half() {
  _step=$(churn_wait "$1") || { _bad="no $1 from dom0"; return 1; }
  [ "$_step" = end ] && { _bad="dom0 ended the cycles at $_i"; return 1; }
  _t0=$(uptime_s)
  for s in $(streams); do
    is_xen_stream "$s" || continue
    carrier_wait "$s-churn" "$(stream_port "$s" churn)" "$2" $((CARRIER_WAIT * 10)) ||
      { _bad="cycle $_i: $s carrier '$CARRIER_SEEN' after the ${1%-*}, not $4"; return 1; }
  done
  awk -v a="$_t0" -v b="$(uptime_s)" 'BEGIN{printf "%.2f\n", b-a}' >> "/tmp/churn-${3%-*}.s"
  lab_note churn-ack "$3" || { _bad="cycle $_i: could not tell dom0 (${3%-*})"; return 1; }
}
# churn_wait STEP: prints "go" once dom0 set data/lab/churn to STEP, "end" if
# dom0 ended the cycles first; fails after 300 s
churn_wait() {
  _w=0
  while [ $_w -lt 1500 ]; do
    [ "$(xenstore-read data/lab/churn 2>/dev/null)" = "$1" ] && { echo go; return 0; }
    xenstore-read data/lab/churn-end >/dev/null 2>&1 && { echo end; return 0; }
    lab_sleep 0.2; _w=$((_w + 1))
  done
  return 1
}

# run_phase ROLE MOVE: one move's streams on this side, with the checks
run_phase() {
  _role=$1; MOVE=$2
  log "==== $MOVE: streams $(streams) ($_role side)"
  if [ "$_role" = server ]; then
    for s in $(streams); do start_stream server "$s" "$s-$MOVE" "$(stream_port "$s" "$MOVE")"; done
    lab_note "$MOVE-listening"
  else
    PEER=$(lab_wait "$MOVE-go" 600) || PEER=none
    log "$MOVE: peer domu1 is dom$PEER"
    for s in $(streams); do
      _peer=$PEER; { [ "$s" = tcp ] || [ "$s" = pre ]; } && _peer=$LAB_NET_DOMU1
      start_stream client "$s" "$s-$MOVE" "$(stream_port "$s" "$MOVE")" "$_peer"
    done
  fi
  # flowing before the move
  for s in $(streams); do flowing "$s-$MOVE" "$s-$MOVE-flows-before" || true; done
  lab_note "$MOVE-flowing"
  case $MOVE in
    away)
      lab_wait away-marked 600 >/dev/null
      for s in $(streams); do
        is_xen_stream "$s" && carrier_is "$s-away" "$(stream_port "$s" away)" '^tcp(/tcp)?$' "$s-away-carrier-tcp"
        flowing "$s-away" "$s-away-flows-while-away" || true
      done
      lab_note away-while-checked
      lab_wait away-back 600 >/dev/null
      for s in $(streams); do
        if is_xen_stream "$s"; then
          carrier_is "$s-away" "$(stream_port "$s" away)" '^ring(-xen)?(/ring)?$' "$s-away-carrier-ring"
          switches_at_least "$s-away" "$(stream_port "$s" away)" 2 "$s-away-switches"
        fi
        flowing "$s-away" "$s-away-flows-after-back" || true
      done
      [ "$_role" = client ] && listener_check away "$PEER"
      kmod_trace away-back ;;
    churn) churn_cycles "$_role" ;;
    *)
      # (both ends run the hook when both move)
      { [ "$_role" = server ] || [ "$MOVE" = bothsave ]; } && uses_hook && suspend_hook "$MOVE"
      _now=$(lab_wait "$MOVE-moved" 900) || _now=none
      log "$MOVE: domid $(own_domid) now (domu1 dom$_now)"
      for s in $(streams); do flowing "$s-$MOVE" "$s-$MOVE-flows-after" || true; done
      # back on a ring once the moved guest runs again beside its peer
      # (both ends moved: each knows only the other's old domid; the
      # agent's table, the same UUID under a new domid, says where the
      # peer went)
      for s in $(streams); do
        is_xen_stream "$s" || continue
        carrier_is "$s-$MOVE" "$(stream_port "$s" "$MOVE")" '^ring(-xen)?(/ring)?$' "$s-$MOVE-carrier-ring"
        # each direction to TCP and back (the user-space status counts
        # tx_to_tcp, tx_to_ring and rx_to_ring: 3)
        _want=4; [ "$GUEST_STACK" = userspace ] && _want=3
        switches_at_least "$s-$MOVE" "$(stream_port "$s" "$MOVE")" "$_want" "$s-$MOVE-switches"
        flowing "$s-$MOVE" "$s-$MOVE-flows-on-ring" || true
      done
      [ "$_role" = client ] && listener_check "$MOVE" "$_now"
      kmod_trace "$MOVE-after"
      if [ "$GUEST_STACK" = kmod ]; then
        sed "s/^/  [af_xen] /" /proc/net/af_xen
        check "$MOVE-proc-own-domid" proc_own_domid
      fi ;;
  esac
  # a scenario's own checks after the move (tests/lab/preload)
  command -v phase_checked > /dev/null 2>&1 && phase_checked "$MOVE"
  lab_note "$MOVE-checked"
  lab_wait "$MOVE-stop" 600 >/dev/null
  for s in $(streams); do touch "/tmp/$s-$MOVE.stop"; done
  # each program prints its own @@RESULT; wait for them (bounded by --stall)
  for s in $(streams); do stop_stream "$s-$MOVE"; done
  pause_metrics "$MOVE"
  kmod_trace "$MOVE"
  lab_note "$MOVE-done"
}
