# Stream helpers shared by the migration scenarios and twohost (sourced).
# GUEST_STACK (kmod | userspace: this guest's, common.sh) says where a
# connection's carrier is shown.
# Stream processes: /tmp/NAME.pid, .status (rewritten each second by the
# program: "sent S got G gap X t T [conn ...]"), .stop (ends it).
RATE=${RATE:-512}         # KiB/s each way, per stream
STALL=${STALL:-240}       # s without a byte: the stream fails (a move pauses it)
MAXS=${MAXS:-1300}        # s: a stream gives up
FLOW_KIB=${FLOW_KIB:-256} # KiB a stream must receive after a move to count as flowing
FLOW_WAIT=${FLOW_WAIT:-90}       # s to wait for that
CARRIER_WAIT=${CARRIER_WAIT:-60} # s for a carrier switch to show

# The bound after which a connection whose carrier switch has not completed
# (TCP legs up) is reset: 10 s by default, made for real machines where a
# save + restore takes a second or two. Under TCG one takes 8-30 s (two
# hosts: 15-60 s with the copy), so the lab sets PEER_LOST_MS. Kernel: the
# module parameter (if this module has it); user space: the variable.
PEER_LOST_MS=${PEER_LOST_MS:-60000}
export XENSOCK_PEER_LOST_MS=$PEER_LOST_MS
set_peer_lost() {
  _p=/sys/module/af_xen/parameters/peer_lost_ms
  if [ -w $_p ]; then echo "$PEER_LOST_MS" > $_p; log "af_xen peer_lost_ms $(cat $_p)"
  else log "af_xen has no peer_lost_ms parameter"; fi
}

# start_stream server|client KIND NAME PORT [PEER]: in the background.
# KIND: kx (C xsstream over AF_XEN), kt|ut (tokio lab_stream), tcp (C
# xsstream over TCP; PEER is an address), pre (the same TCP program,
# dynamically linked, under the preload library on both ends: over
# AF_XEN). PEER: the server's domid.
start_stream() {
  rm -f "/tmp/$3.stop" "/tmp/$3.status"
  _opt="--rate $RATE --stall $STALL --max $MAXS"
  # shellcheck disable=SC2086
  case $1-$2 in
    server-kx) xsstream server xen "$4" "$3" $_opt & ;;
    server-tcp) xsstream server tcp "$4" "$3" $_opt & ;;
    server-pre) env LD_PRELOAD=/opt/xensock/lib/libxensock_preload.so XENSOCK_PRELOAD_LOG=1 \
      xsstream-dyn server tcp "$4" "$3" $_opt & ;;
    server-kt) lab_stream server "$4" "$3" $_opt & ;;
    # the user-space transport as an unprivileged user: the root suspend
    # hook must reach it through the guest's transport claim
    server-ut) runas "$UT_UID" lab_stream server "$4" "$3" $_opt & ;;
    client-kx) xsstream client xen "$5" "$4" "$3" $_opt & ;;
    client-tcp) xsstream client tcp "$5" "$4" "$3" $_opt & ;;
    client-pre) env LD_PRELOAD=/opt/xensock/lib/libxensock_preload.so XENSOCK_PRELOAD_LOG=1 \
      xsstream-dyn client tcp "$5" "$4" "$3" $_opt & ;;
    client-kt) lab_stream client "$5" "$4" "$3" $_opt & ;;
    client-ut) runas "$UT_UID" lab_stream client "$5" "$4" "$3" $_opt & ;;
    # mt (mixed stack): lab_stream on whichever this guest has, the kernel
    # family or the user-space transport
    server-mt) if [ "$GUEST_STACK" = kmod ]; then lab_stream server "$4" "$3" $_opt &
               else runas "$UT_UID" lab_stream server "$4" "$3" $_opt & fi ;;
    client-mt) if [ "$GUEST_STACK" = kmod ]; then lab_stream client "$5" "$4" "$3" $_opt &
               else runas "$UT_UID" lab_stream client "$5" "$4" "$3" $_opt & fi ;;
  esac
  echo $! > "/tmp/$3.pid"
  # (once runas has dropped to it)
  { [ "$2" = ut ] || { [ "$2" = mt ] && [ "$GUEST_STACK" = userspace ]; }; } && ( _p=$!; lab_sleep 2; log "$3: pid $_p runs as uid $(awk '/^Uid:/ {print $2}' /proc/$_p/status 2>/dev/null)" ) &
}
stream_alive() { kill -0 "$(cat "/tmp/$1.pid" 2>/dev/null)" 2>/dev/null; }
# stop_stream NAME: end it (end marker, shutdown) and wait for its verdict;
# one that has not ended STALL + 60 s later is killed (and says so)
stop_stream() {
  touch "/tmp/$1.stop"
  _pid=$(cat "/tmp/$1.pid")
  ( sleep $((STALL + 60)); kill -0 "$_pid" 2>/dev/null && kill -9 "$_pid" &&
    log "$1: still running $((STALL + 60)) s after its stop: killed (no verdict of its own)" ) &
  _dog=$!
  wait "$_pid" 2>/dev/null
  kill "$_dog" 2>/dev/null
}

# tcp_counters: this guest's TCP counters (/proc/net/snmp), InCsumErrors
# among them: segments that failed TCP's checksum
tcp_counters() {
  awk '/^Tcp:/ {if (!n++) {split($0, h); next} for (i = 2; i <= NF; i++) printf "%s=%s ", h[i], $i; print ""}' \
    /proc/net/snmp | sed 's/^/  [tcp] /'
}

# got NAME: bytes received so far
got() { awk '{print $4; exit}' "/tmp/$1.status" 2>/dev/null || echo 0; }

# stuck_report NAME: at a failed check, this domain's other XenStore users'
# threads and whether XenStore still answers (a dead xenstored in dom0
# hangs every guest request; the stream's own threads: stream_stacks)
stuck_report() {
  for _p in $(pidof xensock-discover xenstore-read xenstore-write 2>/dev/null); do
    for _t in /proc/"$_p"/task/*; do
      [ -r "$_t/stat" ] || continue
      log "  [$1 stuck] pid $_p $(cat "$_t/comm" 2>/dev/null) state $(awk '{print $3}' "$_t/stat") wchan $(cat "$_t/wchan" 2>/dev/null)"
    done
  done
  xs_check "$1 stuck"
}

# stream_stacks NAME: where the stream's threads are (wchan, state, the
# syscall in progress; kernel stacks where the kernel has them), once per
# stream, when it stands still: a thread asleep in af_xen shows there
stream_stacks() {
  [ -e "/tmp/$1.stacks" ] && return 0
  touch "/tmp/$1.stacks"
  _p=$(cat "/tmp/$1.pid" 2>/dev/null) || return 0
  for _d in /proc/"$_p"/task/*; do
    echo "  [stacks $1] task ${_d##*/} $(cat "$_d/comm" 2>/dev/null) wchan $(cat "$_d/wchan" 2>/dev/null) state $(awk '{print $3}' "$_d/stat" 2>/dev/null) syscall $(cat "$_d/syscall" 2>/dev/null)"
    sed "s/^/  [stacks $1]   /" "$_d/stack" 2>/dev/null | head -n 25
  done
  # CPU time (user, system ticks) of each thread over 2 s: a thread that
  # spins shows where (user space or the kernel)
  _c0=$(for _d in /proc/"$_p"/task/*; do echo "${_d##*/} $(awk '{print $14, $15}' "$_d/stat" 2>/dev/null)"; done)
  sleep 2
  for _d in /proc/"$_p"/task/*; do
    _t=${_d##*/}
    echo "  [stacks $1] task $_t utime/stime ticks: $(echo "$_c0" | awk -v t="$_t" '$1 == t {print $2, $3}') -> $(awk '{print $14, $15}' "$_d/stat" 2>/dev/null) (2 s)"
  done
  [ "$GUEST_STACK" = kmod ] && sed "s/^/  [stacks $1] /" /proc/net/af_xen
  return 0
}

# flowing NAME CHECK: the stream receives FLOW_KIB more within FLOW_WAIT s
flowing() {
  _g0=$(got "$1"); _want=$((_g0 + FLOW_KIB * 1024)); _t=0
  while [ "$(got "$1")" -lt "$_want" ]; do
    [ $_t -eq 30 ] && stream_stacks "$1"
    if ! stream_alive "$1"; then
      result "$2" FAIL "the stream ended (its own result says why) at $(got "$1") bytes received"; return 1
    fi
    _t=$((_t + 1))
    if [ $_t -gt "$FLOW_WAIT" ] && [ ! -e "/tmp/$1.status" ]; then
      result "$2" FAIL "not connected after ${FLOW_WAIT}s (still in connect/accept; see $1-connect)"; stuck_report "$1"; return 1
    fi
    if [ $_t -gt "$FLOW_WAIT" ]; then
      result "$2" FAIL "stalled: received $(got "$1") bytes, $((_want - $(got "$1"))) short of +${FLOW_KIB} KiB after ${FLOW_WAIT}s"; stuck_report "$1"; return 1
    fi
    sleep 1
  done
  result "$2" PASS "received $_g0 -> $(got "$1") bytes"
}

# ---- the carrier of a connection ----------------------------------------------
# kmod: /proc/net/af_xen, the ESTABLISHED row whose local or peer port is
# PORT, column whose header matches COL; "?nocol" / "?noconn" if absent
afx_col() {
  awk -v p="$1" -v col="$2" '
    NR == 1 { for (i = 1; i <= NF; i++) if ($i ~ col) c = i; if (!c) { print "?nocol"; exit } ; next }
    $1 == "ESTABLISHED" && ($2 ~ ":" p "$" || $3 ~ ":" p "$") { print $c; f = 1; exit }
    END { if (c && !f) print "?noconn" }' /proc/net/af_xen 2>/dev/null
}
# userspace: the connection's Transport::status() line that lab_stream
# writes into its status file ("... conn ConnStatus { ..., carrier: Ring }"
# or "carrier: Switched { tx: \"tcp\", rx: \"tcp\", tx_to_tcp: 1, ... }")
us_carrier() {
  _l=$(sed -n 's/.* conn .*carrier: //p' "/tmp/$1.status" 2>/dev/null | head -n 1)
  case $_l in
    '') echo '?nocol' ;;
    Ring*) echo ring ;;
    *) _tx=$(echo "$_l" | sed -n 's/.*tx: "\([a-z]*\)".*/\1/p')
       _rx=$(echo "$_l" | sed -n 's/.*rx: "\([a-z]*\)".*/\1/p')
       echo "${_tx:-?}/${_rx:-?}" ;;
  esac
}
us_switches() {
  _l=$(sed -n 's/.* conn .*carrier: //p' "/tmp/$1.status" 2>/dev/null | head -n 1)
  case $_l in
    '') echo '?nocol' ;;
    Ring*) echo 0 ;;
    *) echo "$_l" | grep -o '_to_[a-z]*: [0-9]*' | awk '{n += $2} END {print n + 0}' ;;
  esac
}
# carrier NAME PORT: kmod "ring-xen" | "tcp" | "draining" | ...;
# userspace "ring" or "<tx>/<rx>" (e.g. "tcp/tcp")
carrier() {
  if [ "$GUEST_STACK" = kmod ]; then afx_col "$2" '^carrier$'; else us_carrier "$1"; fi
}
# kmod: the sum of the switch counters (columns to_tcp, to_ring, or any
# whose header says switch)
afx_switches() {
  awk -v p="$1" '
    NR == 1 { for (i = 1; i <= NF; i++) if ($i ~ /^to_tcp$|^to_ring$|switch/) c[++nc] = i
              if (!nc) { print "?nocol"; exit } ; next }
    $1 == "ESTABLISHED" && ($2 ~ ":" p "$" || $3 ~ ":" p "$") { n = 0; for (k = 1; k <= nc; k++) n += $(c[k]); print n; f = 1; exit }
    END { if (nc && !f) print "?noconn" }' /proc/net/af_xen 2>/dev/null
}
switches() { # NAME PORT
  if [ "$GUEST_STACK" = kmod ]; then afx_switches "$2"; else us_switches "$1"; fi
}
carrier_source() {
  if [ "$GUEST_STACK" = kmod ]; then echo "/proc/net/af_xen"; else echo "the connection's Transport::status() line"; fi
}
# carrier_wait NAME PORT REGEX TENTHS: quietly, until the carrier matches
# REGEX (0), the stream ended or the connection is gone (1) or TENTHS tenths
# of a second passed (1); the last carrier seen in CARRIER_SEEN
carrier_wait() {
  _t=0
  while :; do
    CARRIER_SEEN=$(carrier "$1" "$2")
    echo "$CARRIER_SEEN" | grep -qiE "$3" && return 0
    case $CARRIER_SEEN in '?nocol'|'?noconn') return 1 ;; esac
    stream_alive "$1" || return 1
    _t=$((_t + 1)); [ $_t -gt "$4" ] && return 1
    lab_sleep 0.1
  done
}
# carrier_is NAME PORT REGEX CHECK: wait until the carrier matches REGEX
carrier_is() {
  _t=0
  while :; do
    _c=$(carrier "$1" "$2")
    if [ "$_c" = '?nocol' ]; then
      result "$4" FAIL "no carrier column/field in $(carrier_source)"
      [ "$GUEST_STACK" = kmod ] && head -n 1 /proc/net/af_xen | sed "s/^/  [$4] /"
      return 1
    fi
    if echo "$_c" | grep -qiE "$3"; then result "$4" PASS "carrier $_c"; return 0; fi
    if ! stream_alive "$1"; then
      result "$4" FAIL "the stream ended (its own result says why); carrier was '$_c'"; return 1
    fi
    if [ "$_c" = '?noconn' ] && [ "$GUEST_STACK" = kmod ]; then
      result "$4" FAIL "no ESTABLISHED socket on port $2 in /proc/net/af_xen (reset?)"
      sed "s/^/  [$4] /" /proc/net/af_xen; return 1
    fi
    _t=$((_t + 1))
    if [ $_t -gt "$CARRIER_WAIT" ]; then
      result "$4" FAIL "carrier '$_c' after ${CARRIER_WAIT}s, wanted /$3/"
      if [ "$GUEST_STACK" = kmod ]; then sed "s/^/  [$4] /" /proc/net/af_xen
      else sed "s/^/  [$4] /" "/tmp/$1.status"; fi
      return 1
    fi
    sleep 1
  done
}
# switches_at_least NAME PORT N CHECK
switches_at_least() {
  _s=$(switches "$1" "$2")
  case $_s in
    '?nocol') result "$4" FAIL "no switch-count column/field in $(carrier_source)"; return 1 ;;
    '?noconn') result "$4" FAIL "connection of $1 not in $(carrier_source)"; return 1 ;;
  esac
  if [ "$_s" -ge "$3" ] 2>/dev/null; then result "$4" PASS "$_s switches"
  else result "$4" FAIL "'$_s' switches, wanted >= $3"; fi
}
