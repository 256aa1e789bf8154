# userspace-death, domu1: an echo server on port 10 that outlives this
# script (dom0 destroys this domain).
check advertise xensock-discover advertise
lab_echo server 10 > /tmp/victim.log 2>&1 &
log "echo server on port 10 (pid $!)"
