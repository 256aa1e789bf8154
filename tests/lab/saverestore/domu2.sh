# saverestore, domu2: after domu1's restore, it is reachable again from here.
wait_until 380 xenstore-read data/lab-moved || log "never told about the restore"
check ping-domu1-after-restore wait_until 30 ping -c 1 -W 2 "$LAB_NET_DOMU1"
