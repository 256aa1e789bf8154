# kmod, domu1: module lifecycle checks around the C tests.
. /scenario/common.sh
# rmmod with an open socket is refused (the socket holds a module reference)
check kmod-rmmod-busy sh -c 'xstest hold 3 & sleep 1; if rmmod af_xen; then echo "rmmod succeeded with a socket open"; exit 1; fi; wait'
check kmod-rmmod rmmod af_xen
check kmod-reload sh -c "insmod $KO && test -d /sys/module/af_xen && rmmod af_xen"
# socket(19, ...) with the module unloaded loads it by its alias net-pf-19
mkdir -p /lib/modules/$(uname -r)/extra
cp $KO /lib/modules/$(uname -r)/extra/
depmod
echo /bin/modprobe > /proc/sys/kernel/modprobe
check kmod-autoload sh -c 'xstest autoload && test -d /sys/module/af_xen'
check kmod-dmesg-clean sh -c '! dmesg | grep -E "BUG|Oops|WARNING|general protection|refcount_t|leak"'
dmesg | tail -n 20
