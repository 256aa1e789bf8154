# kmod, domu1: cross-domain server, then module lifecycle checks.
. /scenario/common.sh
# the cross-domain server: domu2's xstest xclient connects to it
run_c c-xserver xserver 64
# ring sizes, 4 MiB rings, SOCK_SEQPACKET (tests/lab/c/xstest_seqpacket.c)
for _m in seq-local server; do
  if xstest-seqpacket $_m; then result c-sp-$_m PASS; else result c-sp-$_m FAIL "rc=$?"; fi
done
dmesg | grep af_xen | tail -n 20
# rmmod with an open socket is refused (the socket holds a module reference)
check kmod-rmmod-busy sh -c 'xstest hold 3 & sleep 1; if rmmod af_xen; then echo "rmmod succeeded with a socket open"; exit 1; fi; wait'
# rmmod with the link to domu2 up: retracts it (domu2 sees the link go down)
check kmod-rmmod rmmod af_xen
check kmod-reload sh -c "insmod $KO && test -d /sys/module/af_xen && sleep 5 && rmmod af_xen"
# socket(19, ...) with the module unloaded loads it by its alias net-pf-19
mkdir -p /lib/modules/$(uname -r)/extra
cp $KO /lib/modules/$(uname -r)/extra/
depmod
echo /bin/modprobe > /proc/sys/kernel/modprobe
check kmod-autoload sh -c 'xstest autoload && test -d /sys/module/af_xen'
check kmod-dmesg-clean sh -c '! dmesg | grep -E "BUG|Oops|WARNING|general protection|refcount_t|leak"'
dmesg | tail -n 30
