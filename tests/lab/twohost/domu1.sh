# twohost, domu1 (stays on host a): TCP to host b's dom0 across the
# inter-host network, then a checksummed echo stream through domu2 that
# must survive domu2's trips to host b and back.
check ping-dom0b wait_until 180 ping -c 1 -W 2 "$LAB_NET_DOM0B"
check cross-host-tcp-client xlbench tcp client "$LAB_NET_DOM0B" 7100 4 100 120
check ping-domu2 wait_until 60 ping -c 1 -W 2 "$LAB_NET_DOMU2"

# 10 numbered lines a second until dom0 says stop; domu2 echoes them back
# (one TCP connection, netfront both ends); each echo is stamped on arrival.
PAD=$(printf '%0100d' 0)
produce() {
  i=0
  while [ $i -lt 12000 ]; do
    i=$((i + 1)); printf 'seq %06d %s\n' $i "$PAD"
    if [ $((i % 10)) -eq 0 ] && xenstore-read data/lab-stop >/dev/null 2>&1; then break; fi
    usleep 100000
  done
}
stamp() { while IFS= read -r l; do echo "$(cut -d' ' -f1 /proc/uptime) $l"; done; }
( produce | tee /tmp/sent | timeout 1100 nc "$LAB_NET_DOMU2" 7002 | stamp > /tmp/echo.ts ) &
wait_until 60 test -s /tmp/echo.ts || log "no echo from domu2 within 60 s"
xenstore-write data/stream-started 1
wait_until 950 xenstore-read data/lab-stop || log "dom0 never said stop"
sleep 2
# everything sent must come back (TCP retransmits what the move delayed)
wait_until 180 sh -c '[ "$(wc -l < /tmp/echo.ts)" -ge "$(wc -l < /tmp/sent)" ]'
SENT=$(wc -l < /tmp/sent); GOT=$(wc -l < /tmp/echo.ts)
log "stream: $SENT lines sent, $GOT echoed; sha256 sent $(sha256sum < /tmp/sent | cut -c1-16), echoed $(cut -d' ' -f2- /tmp/echo.ts | sha256sum | cut -c1-16)"
check stream-intact sh -c 'test "$(wc -l < /tmp/sent)" -gt 0 && cut -d" " -f2- /tmp/echo.ts | cmp - /tmp/sent'
metric stream.lines "$SENT" lines
metric stream.max_gap_s "$(awk 'NR > 1 && $1 - p > m {m = $1 - p} {p = $1} END {printf "%.2f", m}' /tmp/echo.ts)" s
