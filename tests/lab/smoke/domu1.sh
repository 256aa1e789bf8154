# smoke, domu1: servers (TCP over netfront, libxenvchan) for domu2's clients.
PEER=$(xlbench xsread data/peer 60)
ME=$(own_domid)
log "domid $ME, peer domu2 is dom$PEER"
timeout 240 xlbench tcp server 7001 4 100 > /tmp/tcp.log 2>&1 &
TCP=$!
timeout 240 xlbench vchan server "$PEER" "/local/domain/$ME/data/lab-vchan" 4 100 > /tmp/vchan.log 2>&1 &
VCHAN=$!
. /scenario/common.sh
check rust-module-unload rmmod xensock_hello
check rust-sample-modprobe modprobe rust_minimal
check ping-domu2 wait_until 60 ping -c 1 -W 2 "$LAB_NET_DOMU2"
check_wait tcp-server "$TCP" /tmp/tcp.log
check_wait vchan-server "$VCHAN" /tmp/vchan.log
cat /tmp/tcp.log /tmp/vchan.log
