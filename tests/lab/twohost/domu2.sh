# twohost, domu2 (moves a -> b -> a): echoes domu1's stream; ticks with its
# domid until host a's dom0 says the moves are done.
START=$(own_domid)
timeout 1100 nc -l -p 7002 -e cat > /tmp/echo-server.log 2>&1 &
i=0
while [ -z "$(xenstore-read data/lab-done 2>/dev/null)" ] && [ $i -lt 950 ]; do
  i=$((i + 1)); echo "tick $i domid=$(own_domid)"; sleep 1
done
NOW=$(own_domid)
log "domid $START at start, $NOW now"
check domid-changed test "$NOW" != "$START"
check ping-domu1-after-moves wait_until 30 ping -c 1 -W 2 "$LAB_NET_DOMU1"
