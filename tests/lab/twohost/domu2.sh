# twohost, domu2 (moves a -> b -> a): echoes domu1's stream; ticks with its
# domid until host a's dom0 says the moves are done.
# Also the server end of domu1's two AF_XEN streams (streams.sh).
MIG_STACK=kmod GUEST_STACK=kmod
PEER_LOST_MS=180000   # a move between the hosts (save, copy, restore) takes 15-60 s here
. /scenario/streams.sh
START=$(own_domid)
timeout 1600 nc -l -p 7002 -e cat > /tmp/echo-server.log 2>&1 &
check kmod-insmod insmod /opt/xensock/af_xen.ko
set_peer_lost
# advertise again in every new home (host b, then host a again)
xensock-discover advertise --keep --addr "$LAB_NET_DOMU2" > /tmp/advertise.log 2>&1 &
start_stream server kx kx 7601
start_stream server kt kt 7611
start_stream server tcp kp 7621
i=0
while [ -z "$(xenstore-read data/lab-done 2>/dev/null)" ] && [ $i -lt 1500 ]; do
  i=$((i + 1)); echo "tick $i domid=$(own_domid)"; sleep 1
done
NOW=$(own_domid)
log "domid $START at start, $NOW now"
stop_stream kx; stop_stream kt; stop_stream kp
sed "s/^/  [af_xen] /" /proc/net/af_xen
check domid-changed test "$NOW" != "$START"
check ping-domu1-after-moves wait_until 30 ping -c 1 -W 2 "$LAB_NET_DOMU1"
tcp_counters
# the module's account of its switches (pr_info: not on the console at loglevel 4)
dmesg | grep -E "af_xen|BUG|WARNING|Oops" | tail -n 40
