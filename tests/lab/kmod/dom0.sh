# kmod, dom0 side: stand in for the discovery agent and make the link
# directories for the two domUs: /local/domain/<A>/data/xensock/link/<B>
# owned by A and readable by B ("nA,rB"), both ways. A domU kernel cannot
# set XenStore permissions, so the directory comes from dom0.
D1=$(xl domid domu1); D2=$(xl domid domu2)
log "link directories: dom$D1 <-> dom$D2"
# The dom0 initramfs has no xenstore-chmod, but the xenstore tools are one
# binary that dispatches on its name.
ln -sf /usr/bin/xenstore-write /tmp/xenstore-chmod
# A node gets its parent's permissions when it is created, and the domU acts
# as soon as link/<B> appears: so link/<B> must be born with nA,rB (an agent
# does write+chmod in one transaction; the shell tools cannot). Open the
# parent to B for the creation, then close it again.
mklink() {
  _l=/local/domain/$1/data/xensock/link
  xenstore-write "$_l" "" &&
  /tmp/xenstore-chmod "$_l" "n$1" "r$2" &&
  xenstore-write "$_l/$2" "" &&
  /tmp/xenstore-chmod "$_l/$2" "n$1" "r$2" &&
  /tmp/xenstore-chmod "$_l" "n$1"
}
mklink "$D1" "$D2" && mklink "$D2" "$D1"
check xs-link-perms sh -c "xenstore-ls -p /local/domain/$D1/data/xensock | grep -q 'n$D1,r$D2' && xenstore-ls -p /local/domain/$D2/data/xensock | grep -q 'n$D2,r$D1'"
xenstore-ls -p /local/domain/$D1/data/xensock
# both modules advertise their half, then map the peer's: state 4 on both sides
check xs-link-connected wait_until 240 sh -c "test \"\$(xenstore-read /local/domain/$D1/data/xensock/link/$D2/state)\" = 4 && test \"\$(xenstore-read /local/domain/$D2/data/xensock/link/$D1/state)\" = 4"
xenstore-ls /local/domain/$D1/data/xensock
xenstore-ls /local/domain/$D2/data/xensock
