# kmod: load af_xen.ko and run the single-domain C tests (sourced by domu*.sh).
KO=/opt/xensock/af_xen.ko
check kmod-insmod insmod $KO
check kmod-family-sysfs sh -c 'test "$(cat /sys/module/af_xen/parameters/family)" = 19'
dmesg | grep -i af_xen
# the C tests print their own @@RESULT c-* lines
check c-local xstest local
check c-loop xstest loop
