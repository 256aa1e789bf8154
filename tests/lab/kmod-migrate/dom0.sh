# kmod-migrate, dom0 side: the link directories for the two domUs, as in
# tests/lab/kmod/dom0.sh (stand-in for the discovery agent).
D1=$(xl domid domu1); D2=$(xl domid domu2)
log "link directories: dom$D1 <-> dom$D2"
ln -sf /usr/bin/xenstore-write /tmp/xenstore-chmod
mklink() {
  _l=/local/domain/$1/data/xensock/link
  xenstore-write "$_l" "" &&
  /tmp/xenstore-chmod "$_l" "n$1" "r$2" &&
  xenstore-write "$_l/$2" "" &&
  /tmp/xenstore-chmod "$_l/$2" "n$1" "r$2" &&
  /tmp/xenstore-chmod "$_l" "n$1"
}
mklink "$D1" "$D2" && mklink "$D2" "$D1"
check xs-link-connected wait_until 240 sh -c "test \"\$(xenstore-read /local/domain/$D1/data/xensock/link/$D2/state)\" = 4 && test \"\$(xenstore-read /local/domain/$D2/data/xensock/link/$D1/state)\" = 4"
