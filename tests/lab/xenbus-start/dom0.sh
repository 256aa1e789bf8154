# xenbus-start, dom0: save + restore domu1 (control), let it have a
# TRANSACTION_START refused, then save it again. A kernel that counts the
# refusal twice never finishes the second save's suspend. Then let it
# close /dev/xen/xenbus with a transaction open and save it a third time:
# a kernel that counts the end it sends for it as a kernel transaction's
# never finishes that suspend.
D1=$(xl domid domu1)
# save_then_restore AFTER: save domu1 (check save-after-AFTER); a guest
# that did not suspend is destroyed and the script ends there; else it is
# restored (check restore-after-AFTER) and D1 is its new domid
save_then_restore() {
  check "save-after-$1" timeout 200 xl save domu1 /tmp/domu1.save
  if xl domid domu1 >/dev/null 2>&1; then
    log "domu1 did not suspend (still dom$(xl domid domu1)): destroying it"
    xl destroy domu1
    exit 0
  fi
  check "restore-after-$1" timeout 200 xl restore /tmp/domu1.save
  rm -f /tmp/domu1.save
  D1=$(xl domid domu1 2>/dev/null || echo none)
  log "domu1 is dom$D1 after the restore"
}
wait_domu domu1 '^tick 2 ' 120 || log "domu1 never started ticking"
check save-before timeout 200 xl save domu1 /tmp/domu1.save
check restore-before timeout 200 xl restore /tmp/domu1.save
rm -f /tmp/domu1.save
D1=$(xl domid domu1 2>/dev/null || echo none)
log "domu1 is dom$D1 after the first restore"
xenstore-write "/local/domain/$D1/data/lab/go-refuse" 1
wait_until 120 xenstore-read "/local/domain/$D1/data/lab/refused" || log "domu1 never reported its refused start"
save_then_restore refused-start
# then a transaction left open when its process closes /dev/xen/xenbus
xenstore-write "/local/domain/$D1/data/lab/go-leave-open" 1
wait_until 120 xenstore-read "/local/domain/$D1/data/lab/left-open" || log "domu1 never reported its transaction left open"
save_then_restore left-open
xenstore-write "/local/domain/$D1/data/lab/done" 1
