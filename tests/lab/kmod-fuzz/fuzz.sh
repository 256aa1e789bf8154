# kmod-fuzz, both domUs: af_xen.ko, then the fuzzer (tests/lab/c/xsfuzz.c)
# against the other domU, while a loop tries to unload the module (the
# fuzzers' sockets must keep it: EBUSY), and dom0 saves and restores the
# domUs. At the end, with every fuzzer process gone, the module unloads.
. /opt/xensock/fuzz.env
check kmod-insmod insmod /opt/xensock/af_xen.ko
n=${LAB_ROLE#domu}
# advertised (again after every move: --keep), the agent in dom0 lists
# the peers and makes the link directories
MY_IP=$LAB_NET_DOMU1; [ "$n" = 2 ] && MY_IP=$LAB_NET_DOMU2
xensock-discover advertise --keep --addr "$MY_IP" > /tmp/advertise.log 2>&1 &
check advertise wait_until 30 xenstore-read data/xensock/addrs
# the peer's domid, kept current: dom0 writes data/peer anew when it
# restored the peer under a new domid (the fuzzer reads the file every 5 s)
xlbench xsread data/peer 120 > /tmp/peer
( while [ ! -e /tmp/fuzz.done ]; do
    p=$(xenstore-read data/peer 2>/dev/null) && [ -n "$p" ] && echo "$p" > /tmp/peer.new && mv /tmp/peer.new /tmp/peer
    lab_sleep 5
  done ) &
# rmmod while the fuzzers hold sockets: refused (EBUSY) every time; if it
# ever succeeds (no socket open at that instant), the module goes back in
( tries=0 refused=0 unloaded=0
  while [ ! -e /tmp/fuzz.done ]; do
    lab_sleep 20
    [ -e /tmp/fuzz.done ] && break
    tries=$((tries + 1))
    if out=$(rmmod af_xen 2>&1); then
      unloaded=$((unloaded + 1)); insmod /opt/xensock/af_xen.ko || echo "insmod after rmmod failed"
    else
      case $out in *"in use"*|*"busy"*|*"Resource temporarily"*) refused=$((refused + 1)) ;; *) echo "rmmod: $out" ;; esac
    fi
  done
  echo "$tries $refused $unloaded" > /tmp/rmmod.count ) &
RMMOD_LOOP=$!
log "fuzzing: peer dom$(cat /tmp/peer), seed $((FUZZ_SEED + n)), $FUZZ_SECONDS s"
# findings reach the console as they come (the first 50): a domU that
# dom0 destroys never gets to its summary
{ xsfuzz -s $((FUZZ_SEED + n)) -t "$FUZZ_SECONDS" -p /tmp/peer -P "$FUZZ_PROCS" -T "$FUZZ_THREADS" -n "$LAB_ROLE" 2>&1; echo $? > /tmp/fuzz.rc; } |
  tee /tmp/fuzz.log | awk '/FINDING/ && n++ < 50 { print; fflush() }'
rc=$(cat /tmp/fuzz.rc)
touch /tmp/fuzz.done
grep -v FINDING /tmp/fuzz.log
nf=$(grep -c FINDING /tmp/fuzz.log)
[ "$nf" = 0 ] || { echo "findings by kind:"; grep FINDING /tmp/fuzz.log | sed 's/^xsfuzz\[[^]]*\]: //' | sort | uniq -c | sort -rn | head -n 30; }
if [ $rc = 0 ] && [ "$nf" = 0 ]; then result fuzz PASS "seed $((FUZZ_SEED + n)), $(grep -o '[0-9]* calls' /tmp/fuzz.log | awk '{s += $1} END {print s + 0}') calls"
else result fuzz FAIL "seed $((FUZZ_SEED + n)): rc=$rc, $nf findings"; fi
wait $RMMOD_LOOP
set -- $(cat /tmp/rmmod.count 2>/dev/null || echo 0 0 0)
log "rmmod while fuzzing: $1 tries, $2 refused as busy, $3 unloaded"
if [ "$1" -gt 0 ] && [ "$(( $2 + $3 ))" = "$1" ]; then result fuzz-rmmod-refused PASS "$2 of $1 refused as busy, $3 unloaded and reloaded"
else result fuzz-rmmod-refused FAIL "$1 tries, $2 refused as busy, $3 unloaded"; fi
# every fuzzer process is gone (the forked ones end by alarm): the module
# lets go once the connections they left have closed
check fuzz-unload wait_until 120 rmmod af_xen
grep -E '^(sockets|grants|maps|evtchns|map_failures|proto_resets) ' /proc/net/af_xen_stats 2>/dev/null
dmesg | grep -c "af_xen" | sed 's/^/af_xen log lines: /'
