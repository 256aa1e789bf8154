# xenbus-overwrite, dom0: wait for domu1's pairs, then say whether
# xenstored lived through them (dom0 also prints @@XENSTORED-GONE at once
# if it did not).
wait_domu domu1 '^xs_overwrite done' 200 || log "domu1 never finished its pairs"
if pidof xenstored >/dev/null; then metric xenstored-alive 1 bool; else metric xenstored-alive 0 bool; fi
