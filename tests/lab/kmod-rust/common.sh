# kmod-rust: load af_xen.ko (sourced by domu*.sh).
KO=/opt/xensock/af_xen.ko
check kmod-insmod insmod $KO
log "af_xen family $(cat /sys/module/af_xen/parameters/family 2>&1)"
