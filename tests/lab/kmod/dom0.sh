# kmod, dom0 side: stand in for the discovery agent and make the link
# directories for the two domUs: /local/domain/<A>/data/xensock/link/<B>
# owned by A and readable by B ("nA,rB"), both ways. A domU kernel cannot
# set XenStore permissions, so the directory comes from dom0.
D1=$(xl domid domu1); D2=$(xl domid domu2)
log "link directories: dom$D1 <-> dom$D2"
# mklink (lab/guest/lib.sh) says why link/<B> is made the way it is
mklink "$D1" "$D2" && mklink "$D2" "$D1"
# a link from domu2 to dom0, which runs no module: connects over it stay in
# progress (xstest xpending)
mklink "$D2" 0
check xs-link-perms sh -c "xenstore-ls -p /local/domain/$D1/data/xensock | grep -q 'n$D1,r$D2' && xenstore-ls -p /local/domain/$D2/data/xensock | grep -q 'n$D2,r$D1'"
xenstore-ls -p /local/domain/$D1/data/xensock
# both modules advertise their half, then map the peer's: state 4 on both sides
check xs-link-connected wait_until 240 sh -c "test \"\$(xenstore-read /local/domain/$D1/data/xensock/link/$D2/state)\" = 4 && test \"\$(xenstore-read /local/domain/$D2/data/xensock/link/$D1/state)\" = 4"
xenstore-ls /local/domain/$D1/data/xensock
xenstore-ls /local/domain/$D2/data/xensock

# peer-domain death: domu2 finished its script and left its victim
# streaming to domu1; once domu1 has both connections, destroy domu2
check domu2-script-done wait_domu domu2 '^@@EXIT' 1000
check domu1-death-ready wait_domu domu1 '^@@RESULT c-xd-ready ' 600
check xl-destroy-domu2 xl destroy domu2
# what xensock-agent writes when a domain is released without a move
# marker: the survivor's table says the domain is gone for good
xenstore-write /local/domain/$D1/xensock/gone/$D2 1
check domu2-gone sh -c '! xl list domu2 >/dev/null 2>&1'
# once domu1 closed its sockets no page of domu2 stays mapped, so Xen can
# free the dead domain completely (no "(null)" zombie in xl list)
check domu1-death-closed wait_domu domu1 '^@@RESULT c-xd-closed ' 300
check xen-domu2-freed wait_until 120 sh -c '! xl list | grep -q "(null)"'
xl list
