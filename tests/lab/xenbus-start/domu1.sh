# xenbus-start, domu1: tick (dom0 saves and restores us once), then have
# xenstored refuse a TRANSACTION_START of ours, then (saved and restored
# again) close /dev/xen/xenbus with a transaction open, then tick until
# dom0 is done.
i=0
while [ -z "$(xenstore-read data/lab/go-refuse 2>/dev/null)" ] && [ $i -lt 300 ]; do
  i=$((i + 1)); echo "tick $i domid=$(own_domid)"; sleep 1
done
check start-refused xs_refused_start
xenstore-write data/lab/refused 1
i=0
while [ -z "$(xenstore-read data/lab/go-leave-open 2>/dev/null)" ] && [ $i -lt 300 ]; do
  i=$((i + 1)); echo "tick $i domid=$(own_domid)"; sleep 1
done
check left-open xs_left_open
xenstore-write data/lab/left-open 1
i=0
while [ -z "$(xenstore-read data/lab/done 2>/dev/null)" ] && [ $i -lt 300 ]; do
  i=$((i + 1)); echo "tick $i domid=$(own_domid)"; sleep 1
done
