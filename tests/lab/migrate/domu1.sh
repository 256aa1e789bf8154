# migrate, domu1: tick with our domid until dom0 says we were migrated.
START=$(own_domid)
i=0
while [ -z "$(xenstore-read data/lab-moved 2>/dev/null)" ] && [ $i -lt 350 ]; do
  i=$((i + 1)); echo "tick $i domid=$(own_domid)"; sleep 1
done
NOW=$(own_domid)
log "domid $START at start, $NOW now"
check domid-changed test "$NOW" != "$START"
check ping-dom0-after-migrate wait_until 30 ping -c 1 -W 2 "$LAB_NET_DOM0"
