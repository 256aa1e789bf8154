# smoke: checks both domUs run (sourced by domu1.sh and domu2.sh).
check xen-devices sh -c 'for d in gntalloc gntdev evtchn xenbus; do test -c /dev/xen/$d || { echo "missing /dev/xen/$d"; exit 1; }; done'
ls -l /dev/xen/
check xenstore-domid test -n "$(own_domid)"
# an out-of-tree Rust-for-Linux module built against the lab kernel
check rust-module-load insmod /lab/modules/xensock_hello.ko
dmesg | grep xensock_hello
check rust-module-dmesg sh -c 'dmesg | grep -q "xensock_hello: loaded, sum=6"'
