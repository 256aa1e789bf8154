# kmod-impostor, domu3: the impostor, an ordinary guest with af_xen.ko
# loaded. When dom0 has linked it with domu2 (whose peer domu1 is saved),
# it sends ring offers for connection ids 1..FORGED over that link
# (module parameter inject_ring_offers), as domu1 would when back under a
# new domid.
. /scenario/common.sh
# domu2's connection ids the offers name
FORGED=64
VICTIM=$(xlbench xsread data/forge 600)
log "posing as domu2's moved peer towards dom$VICTIM"
check impostor-linked wait_until 60 sh -c "dmesg | grep -q 'link to dom$VICTIM up'"
echo $FORGED > /sys/module/af_xen/parameters/inject_ring_offers
check impostor-offers-sent wait_until 30 sh -c "dmesg | grep -q 'inject_ring_offers: forged ring offers for connections 1..$FORGED to dom$VICTIM'"
# stay loaded while domu2 decides (its offer to us goes unanswered)
sleep 40
dmesg | grep -E 'af_xen' | tail -n 20
finish
