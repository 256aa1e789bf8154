# smoke, dom0 side: the toolstack sees both domUs, each vif is on xenbr0,
# dom0 reaches both over the bridge.
xl list
check xl-list-domus sh -c 'xl list | grep -q "^domu1 " && xl list | grep -q "^domu2 "'
check bridge-vifs sh -c 'test "$(ls /sys/class/net/xenbr0/brif | grep -c "^vif")" -ge 2'
ls /sys/class/net/xenbr0/brif
check ping-domu1 wait_until 60 ping -c 1 -W 2 "$LAB_NET_DOMU1"
check ping-domu2 wait_until 60 ping -c 1 -W 2 "$LAB_NET_DOMU2"
