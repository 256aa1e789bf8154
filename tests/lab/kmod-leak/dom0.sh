# kmod-leak, dom0: the link directories (as the agent makes them), and
# Xen's own count of each domU's grant table before and after the cycles.
D1=$(xl domid domu1); D2=$(xl domid domu2)
mklink "$D1" "$D2" && mklink "$D2" "$D1"
check xs-link-connected wait_until 600 sh -c "test \"\$(xenstore-read /local/domain/$D1/data/xensock/link/$D2/state)\" = 4 && test \"\$(xenstore-read /local/domain/$D2/data/xensock/link/$D1/state)\" = 4"
# xen_grants DOMID: "FRAMES ACTIVE" of the domain's grant table as Xen
# counts them (debug key g): its frames, and its entries some domain maps
# now. "missing" if the console ring lost the domain's part.
xen_grants() {
  xl dmesg -c >/dev/null
  xl debug-keys g
  lab_sleep 1
  xl dmesg | awk -v d="$1" '
    /grant-table for remote d[0-9]+ / { match($0, /remote d[0-9]+/); cur = substr($0, RSTART + 8, RLENGTH - 8); if (cur == d) seen = 1; next }
    /gnttab_usage_print_all \] done/ { done = 1 }
    cur == d && / frames \(/ { for (i = 1; i < NF && f == ""; i++) if ($(i + 1) == "frames") f = $i; next }
    cur == d && /\[0x[0-9a-f]+\]/ { a++ }
    END { if (seen && done && f != "") print f, a + 0; else print "missing" }'
}
wait_domu domu2 '^@@LEAK-BASE' 1800
xenstore-write /local/domain/$D1/data/leak-base 1
wait_domu domu1 '^@@LEAK-BASE1' 300
BASE1=$(xen_grants "$D1") BASE2=$(xen_grants "$D2")
log "Xen grant tables at the baseline (frames active): domu1 $BASE1, domu2 $BASE2"
check xen-base sh -c "[ '$BASE1' != missing ] && [ '$BASE2' != missing ]"
xenstore-write /local/domain/$D2/data/leak-xen-base 1
wait_domu domu2 '^@@LEAK-MID' 2000
MID1=$(xen_grants "$D1") MID2=$(xen_grants "$D2")
log "Xen grant tables after the first sequence (frames active): domu1 $MID1, domu2 $MID2"
xenstore-write /local/domain/$D2/data/leak-xen-mid 1
wait_domu domu2 '^@@LEAK-END' 2000
wait_domu domu1 '^@@LEAK-END1' 300
END1=$(xen_grants "$D1") END2=$(xen_grants "$D2")
log "Xen grant tables at the end (frames active): domu1 $END1, domu2 $END2"
# Frames never shrink: they grow to what the connections in flight at
# once need (a 1 MiB ring is 258 entries, a frame 512: 10-19 frames in
# 10,000 cycles), and must stay below half the limit of 64. Grants ended
# late grew them to the limit within 150 cycles (every later connect:
# ENOMEM). The entries another domain maps are back to the baseline's.
for d in 1 2; do
  eval "b=\$BASE$d e=\$END$d"
  check "xen-frames-bounded-domu$d" sh -c "[ '$e' != missing ] && [ ${e%% *} -lt 32 ]"
  check "xen-active-back-domu$d" sh -c "[ '$b' != missing ] && [ '$e' != missing ] && [ ${e##* } -le ${b##* } ]"
done
xenstore-write /local/domain/$D1/data/leak-xen-end 1 /local/domain/$D2/data/leak-xen-end 1
