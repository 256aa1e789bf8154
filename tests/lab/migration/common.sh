# Migration scenarios (issue #7 in the lab), shared by both domUs: see
# tests/lab/migration/README.md. Sourced by domu1.sh / domu2.sh.
# /opt/xensock/migration.params (written by scenario_build): MIG_STACK
# (kmod | userspace) and MIG_MOVES (saverestore away migrate, in order).
. /opt/xensock/migration.params
RATE=512          # KiB/s each way, per stream
STALL=240         # s without a byte: the stream fails (a move pauses it)
MAXS=1300         # s: a stream gives up
FLOW_KIB=256      # KiB a stream must receive after a move to count as flowing
FLOW_WAIT=90      # s to wait for that
CARRIER_WAIT=60   # s for a carrier switch to show

# lab_note KEY [VALUE]: tell dom0 (data/lab/KEY in our current home)
lab_note() { xenstore-write "data/lab/$1" "${2:-1}"; }
# lab_wait KEY TIMEOUT_S: until dom0 wrote data/lab/KEY in our home; prints it
lab_wait() {
  wait_until "$2" xenstore-read "data/lab/$1" || { log "dom0 never wrote data/lab/$1 (${2}s)"; return 1; }
  xenstore-read "data/lab/$1"
}

move_index() { case $1 in saverestore) echo 0 ;; away) echo 1 ;; migrate) echo 2 ;; esac; }
# streams of a stack: kx = C xsstream over AF_XEN, kt = tokio over the
# kernel family, ut = tokio over the user-space transport, tcp = C xsstream
# over TCP between the same two domUs (the baseline: it must pass whatever
# xensock does)
streams() { if [ "$MIG_STACK" = kmod ]; then echo "kx kt tcp"; else echo "ut tcp"; fi; }
stream_port() {
  _b=7500; case $1 in kt) _b=7510 ;; tcp) _b=7520 ;; ut) _b=7530 ;; esac
  echo $((_b + $(move_index "$2")))
}
# the check name prefix the program prints (@@RESULT c-... / tokio-...)
stream_prefix() { case $1 in kt|ut) echo tokio ;; *) echo c ;; esac; }
is_xen_stream() { [ "$1" != tcp ]; }

# start_stream ROLE S MOVE [PEER_DOMID]: in the background; pid in /tmp/S-MOVE.pid
start_stream() {
  _n=$2-$3; _p=$(stream_port "$2" "$3")
  rm -f "/tmp/$_n.stop" "/tmp/$_n.status"
  _opt="--rate $RATE --stall $STALL --max $MAXS"
  if [ "$1" = server ]; then
    case $2 in
      kx) xsstream server xen "$_p" "$_n" $_opt & ;;
      tcp) xsstream server tcp "$_p" "$_n" $_opt & ;;
      kt|ut) lab_stream server "$_p" "$_n" $_opt & ;;
    esac
  else
    case $2 in
      kx) xsstream client xen "$4" "$_p" "$_n" $_opt & ;;
      tcp) xsstream client tcp "$LAB_NET_DOMU1" "$_p" "$_n" $_opt & ;;
      kt|ut) lab_stream client "$4" "$_p" "$_n" $_opt & ;;
    esac
  fi
  echo $! > "/tmp/$_n.pid"
}

# got S-MOVE: bytes received so far (from the program's status file)
got() { awk '{print $4; exit}' "/tmp/$1.status" 2>/dev/null || echo 0; }

# flowing S MOVE CHECK: the stream receives FLOW_KIB more within FLOW_WAIT s
flowing() {
  _n=$1-$2; _g0=$(got "$_n"); _want=$((_g0 + FLOW_KIB * 1024)); _t=0
  while [ "$(got "$_n")" -lt "$_want" ]; do
    if ! kill -0 "$(cat "/tmp/$_n.pid")" 2>/dev/null; then
      result "$3" FAIL "the stream ended (its own result says why) at $(got "$_n") bytes received"; return 1
    fi
    _t=$((_t + 1))
    if [ $_t -gt "$FLOW_WAIT" ]; then
      result "$3" FAIL "stalled: received $(got "$_n") bytes, $((_want - $(got "$_n"))) short of +${FLOW_KIB} KiB after ${FLOW_WAIT}s"; return 1
    fi
    sleep 1
  done
  result "$3" PASS "received $_g0 -> $(got "$_n") bytes"
}

# ---- carrier of a connection ------------------------------------------------
# kmod: /proc/net/af_xen, the row of the ESTABLISHED socket whose local or peer
# port is PORT, column named COL (header line); "?nocol" / "?noconn" if absent
afx_col() {
  awk -v p="$1" -v col="$2" '
    NR == 1 { for (i = 1; i <= NF; i++) if ($i ~ col) c = i; if (!c) { print "?nocol"; exit } ; next }
    $1 == "ESTABLISHED" && ($2 ~ ":" p "$" || $3 ~ ":" p "$") { print $c; f = 1; exit }
    END { if (c && !f) print "?noconn" }' /proc/net/af_xen 2>/dev/null
}
# userspace: the connection's status line the program writes (Transport::status)
us_field() {
  sed -n "s/.* conn .*$2[a-z_]*: \([A-Za-z0-9_]*\).*/\1/p" "/tmp/$1.status" 2>/dev/null | head -n 1
}
# carrier S MOVE: the current carrier of stream S's connection
carrier() {
  if [ "$MIG_STACK" = kmod ]; then afx_col "$(stream_port "$1" "$2")" '^carrier$'
  else _c=$(us_field "$1-$2" carrier); echo "${_c:-?nocol}"; fi
}
switches() {
  if [ "$MIG_STACK" = kmod ]; then afx_col "$(stream_port "$1" "$2")" 'switch'
  else _c=$(us_field "$1-$2" switch); echo "${_c:-?nocol}"; fi
}
carrier_source() {
  if [ "$MIG_STACK" = kmod ]; then echo "/proc/net/af_xen"; else echo "the connection's Transport::status() line"; fi
}
# carrier_is S MOVE REGEX CHECK: wait until the carrier matches REGEX
carrier_is() {
  _t=0
  while :; do
    _c=$(carrier "$1" "$2")
    case $_c in
      '?nocol') result "$4" FAIL "no carrier column/field in $(carrier_source) (issue #7 adds it)"
                [ "$MIG_STACK" = kmod ] && head -n 1 /proc/net/af_xen | sed "s/^/  [$4] /"
                return 1 ;;
    esac
    if echo "$_c" | grep -qiE "$3"; then result "$4" PASS "carrier $_c"; return 0; fi
    if ! kill -0 "$(cat "/tmp/$1-$2.pid")" 2>/dev/null; then
      result "$4" FAIL "the stream ended (its own result says why); carrier was '$_c'"; return 1
    fi
    if [ "$_c" = '?noconn' ] && [ "$MIG_STACK" = kmod ]; then
      result "$4" FAIL "no ESTABLISHED socket on port $(stream_port "$1" "$2") in /proc/net/af_xen (reset?)"
      sed "s/^/  [$4] /" /proc/net/af_xen; return 1
    fi
    _t=$((_t + 1))
    if [ $_t -gt "$CARRIER_WAIT" ]; then
      result "$4" FAIL "carrier '$_c' after ${CARRIER_WAIT}s, wanted /$3/"
      [ "$MIG_STACK" = kmod ] && sed "s/^/  [$4] /" /proc/net/af_xen
      [ "$MIG_STACK" = userspace ] && sed "s/^/  [$4] /" "/tmp/$1-$2.status"
      return 1
    fi
    sleep 1
  done
}
# switches_at_least S MOVE N CHECK
switches_at_least() {
  _s=$(switches "$1" "$2")
  case $_s in
    '?nocol') result "$4" FAIL "no switch-count column/field in $(carrier_source) (issue #7 adds it)"; return 1 ;;
    '?noconn') result "$4" FAIL "connection of $1-$2 not in $(carrier_source)"; return 1 ;;
  esac
  if [ "$_s" -ge "$3" ] 2>/dev/null; then result "$4" PASS "$_s switches"
  else result "$4" FAIL "$_s switches, wanted >= $3"; fi
}

# ---- setup and teardown --------------------------------------------------------
mig_setup() {
  if [ "$MIG_STACK" = kmod ]; then
    check kmod-insmod insmod /opt/xensock/af_xen.ko
    log "af_xen family $(cat /sys/module/af_xen/parameters/family 2>&1)"
  fi
  # advertise (again after every move: the new home starts empty); the agent
  # in dom0 then lists the peers and makes the link directories
  xensock-discover advertise --keep --addr "$MY_IP" > /tmp/advertise.log 2>&1 &
  ADV=$!
  check advertise wait_until 30 xenstore-read data/xensock/addrs
}
mig_finish() {
  kill "$ADV" 2>/dev/null
  if [ "$MIG_STACK" = kmod ]; then
    head -n 40 /proc/net/af_xen; cat /proc/net/af_xen_stats
    check kmod-dmesg-clean sh -c '! dmesg | grep -E "BUG|Oops|WARNING|general protection|refcount_t|leak"'
    dmesg | grep -E "af_xen|BUG|WARNING|Oops" | tail -n 30
  fi
}

# run_phase ROLE MOVE: one move's streams on this side, with the checks
run_phase() {
  _role=$1; MOVE=$2
  log "==== $MOVE: streams $(streams) ($_role side)"
  if [ "$_role" = server ]; then
    for s in $(streams); do start_stream server "$s" "$MOVE"; done
    lab_note "$MOVE-listening"
  else
    PEER=$(lab_wait "$MOVE-go" 600) || PEER=none
    log "$MOVE: peer domu1 is dom$PEER"
    for s in $(streams); do start_stream client "$s" "$MOVE" "$PEER"; done
  fi
  # flowing before the move
  for s in $(streams); do flowing "$s" "$MOVE" "$s-$MOVE-flows-before" || true; done
  lab_note "$MOVE-flowing"
  case $MOVE in
    away)
      lab_wait away-marked 600 >/dev/null
      for s in $(streams); do
        is_xen_stream "$s" && carrier_is "$s" away tcp "$s-away-carrier-tcp"
        flowing "$s" away "$s-away-flows-while-away" || true
      done
      lab_note away-checked
      lab_wait away-back 600 >/dev/null
      for s in $(streams); do
        if is_xen_stream "$s"; then
          carrier_is "$s" away ring "$s-away-carrier-ring"
          switches_at_least "$s" away 2 "$s-away-switches"
        fi
        flowing "$s" away "$s-away-flows-after-back" || true
      done ;;
    *)
      lab_wait "$MOVE-moved" 900 >/dev/null
      log "$MOVE: domid $(own_domid) now"
      for s in $(streams); do flowing "$s" "$MOVE" "$s-$MOVE-flows-after" || true; done
      if [ "$MIG_STACK" = kmod ]; then sed "s/^/  [af_xen] /" /proc/net/af_xen; fi ;;
  esac
  lab_note "$MOVE-checked"
  lab_wait "$MOVE-stop" 600 >/dev/null
  for s in $(streams); do touch "/tmp/$s-$MOVE.stop"; done
  # each program prints its own @@RESULT; wait for them (bounded by --stall)
  for s in $(streams); do wait "$(cat "/tmp/$s-$MOVE.pid")" 2>/dev/null; done
  lab_note "$MOVE-done"
}
