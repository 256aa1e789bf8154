# twohost, domu1 (stays on host a): TCP to host b's dom0 across the
# inter-host network, then a checksummed echo stream through domu2 that
# must survive domu2's trips to host b and back; and two AF_XEN streams
# with domu2 (C xsstream "kx", tokio lab_stream "kt", both directions
# checked byte for byte) that must fall back to TCP while domu2 is on host
# b and return to the ring when it is back.
MIG_STACK=kmod GUEST_STACK=kmod
PEER_LOST_MS=180000   # a move between the hosts (save, copy, restore) takes 15-60 s here
. /scenario/streams.sh
lab_note() { xenstore-write "data/lab/$1" "${2:-1}"; }
lab_wait() { wait_until "$2" xenstore-read "data/lab/$1" || { log "dom0 never wrote data/lab/$1 (${2}s)"; return 1; }; }
XS_STREAMS="kx:7601 kt:7611"
check kmod-insmod insmod /opt/xensock/af_xen.ko
set_peer_lost
xensock-discover advertise --keep --addr "$LAB_NET_DOMU1" > /tmp/advertise.log 2>&1 &
PEER=$(xlbench xsread data/peer 60)
log "domu2 is dom$PEER"
for sp in $XS_STREAMS; do start_stream client "${sp%%:*}" "${sp%%:*}" "${sp#*:}" "$PEER"; done
# the same checked stream over plain kernel TCP (netfront both ends): what
# the platform does to TCP bytes across domu2's moves, in the same run
start_stream client tcp kp 7621 "$LAB_NET_DOMU2"
check ping-dom0b wait_until 180 ping -c 1 -W 2 "$LAB_NET_DOM0B"
check cross-host-tcp-client xlbench tcp client "$LAB_NET_DOM0B" 7100 4 100 120
check ping-domu2 wait_until 60 ping -c 1 -W 2 "$LAB_NET_DOMU2"

# 10 numbered lines a second until dom0 says stop; domu2 echoes them back
# (one TCP connection, netfront both ends); each echo is stamped on arrival.
PAD=$(printf '%0100d' 0)
produce() {
  i=0
  while [ $i -lt 16000 ]; do
    i=$((i + 1)); printf 'seq %06d %s\n' $i "$PAD"
    if [ $((i % 10)) -eq 0 ] && xenstore-read data/lab-stop >/dev/null 2>&1; then break; fi
    lab_sleep 0.1
  done
}
stamp() { while IFS= read -r l; do echo "$(cut -d' ' -f1 /proc/uptime) $l"; done; }
( produce | tee /tmp/sent | timeout 1600 nc "$LAB_NET_DOMU2" 7002 | stamp > /tmp/echo.ts ) &
wait_until 60 test -s /tmp/echo.ts || log "no echo from domu2 within 60 s"
for sp in $XS_STREAMS; do flowing "${sp%%:*}" "${sp%%:*}-flows-before" || true; done
xenstore-write data/stream-started 1
# domu2 on host b: the AF_XEN streams are on TCP across the hosts
if lab_wait on-b 900; then
  for sp in $XS_STREAMS; do
    carrier_is "${sp%%:*}" "${sp#*:}" '^tcp(/tcp)?$' "${sp%%:*}-on-b-carrier-tcp"
    flowing "${sp%%:*}" "${sp%%:*}-flows-on-b" || true
  done
fi
lab_note on-b-checked
# back on host a (new domid): the ring again
if lab_wait back-on-a 900; then
  for sp in $XS_STREAMS; do
    carrier_is "${sp%%:*}" "${sp#*:}" '^ring(-xen)?(/ring)?$' "${sp%%:*}-back-carrier-ring"
    switches_at_least "${sp%%:*}" "${sp#*:}" 2 "${sp%%:*}-back-switches"
    flowing "${sp%%:*}" "${sp%%:*}-flows-back-on-a" || true
  done
fi
sed "s/^/  [af_xen] /" /proc/net/af_xen
lab_note back-checked
# live migrations a -> b -> a (only with --xen shadow: dom0 says)
if [ "$(lab_wait live 300 && xenstore-read data/lab/live)" = yes ]; then
  for leg in migrated-to-b migrated-back; do
    if lab_wait $leg 1200; then
      for sp in $XS_STREAMS; do flowing "${sp%%:*}" "${sp%%:*}-flows-$leg" || true; done
    fi
    lab_note $leg-checked
  done
fi
wait_until 1500 xenstore-read data/lab-stop || log "dom0 never said stop"
for sp in $XS_STREAMS; do stop_stream "${sp%%:*}"; done
stop_stream kp
sleep 2
# everything sent must come back (TCP retransmits what the move delayed)
wait_until 180 sh -c '[ "$(wc -l < /tmp/echo.ts)" -ge "$(wc -l < /tmp/sent)" ]'
SENT=$(wc -l < /tmp/sent); GOT=$(wc -l < /tmp/echo.ts)
log "stream: $SENT lines sent, $GOT echoed; sha256 sent $(sha256sum < /tmp/sent | cut -c1-16), echoed $(cut -d' ' -f2- /tmp/echo.ts | sha256sum | cut -c1-16)"
check stream-intact sh -c 'test "$(wc -l < /tmp/sent)" -gt 0 && cut -d" " -f2- /tmp/echo.ts | cmp - /tmp/sent'
metric stream.lines "$SENT" lines
metric stream.max_gap_s "$(awk 'NR > 1 && $1 - p > m {m = $1 - p} {p = $1} END {printf "%.2f", m}' /tmp/echo.ts)" s
# TCP's own count of segments that failed their checksum (InCsumErrors)
tcp_counters
# the module's account of its switches (pr_info: not on the console at loglevel 4)
dmesg | grep -E "af_xen|BUG|WARNING|Oops" | tail -n 40
