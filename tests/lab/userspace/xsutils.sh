# userspace, dom0, part (c): the dom0 command script of
# sim/tests/xenstore_utils.rs (dom0_reads_writes_lists_and_removes,
# watch_prints_the_registration_then_changes, concurrent_tool_writes_all_commit)
# against the REAL xenstored, with the outputs the sim test expects.
# Each comparison is a check xsutil-*; every command's rc/stdout/stderr is logged.
# The dom0 initramfs has only some tool names: they are one binary that
# dispatches on its name.
XT=/tmp/xt; mkdir -p $XT
for n in read write ls list exists rm chmod watch; do
  if command -v xenstore-$n >/dev/null 2>&1; then ln -sf "$(command -v xenstore-$n)" $XT/xenstore-$n
  else ln -sf "$(command -v xenstore-write)" $XT/xenstore-$n; fi
done
# xu NAME RC STDOUT STDERR cmd args...  (STDERR "-" = not compared)
xu() {
  _n=$1 _rc=$2 _out=$3 _err=$4; shift 4
  _t=$1; shift
  $XT/$_t "$@" > /tmp/xu.out 2> /tmp/xu.err; _r=$?
  _o=$(cat /tmp/xu.out; echo x); _o=${_o%x}
  _e=$(cat /tmp/xu.err)
  echo "  [xsutil] \$ $_t $* -> rc=$_r stdout=$(printf %s "$_o" | od -An -c | tr -s ' ' | tr -d '\n') stderr=[$_e]"
  if [ "$_r" = "$_rc" ] && [ "$_o" = "$_out" ] && { [ "$_err" = - ] || [ "$_e" = "$_err" ]; }; then
    result "xsutil-$_n" PASS
  else
    result "xsutil-$_n" FAIL "real: rc=$_r stdout=[$_o] stderr=[$_e]; sim test expects rc=$_rc stdout=[$_out] stderr=[$_err]"
  fi
}
NL='
'
xu write 0 "" - xenstore-write /t/a 1 /t/b/c "two words"
xu read2 0 "1${NL}two words${NL}" - xenstore-read /t/a /t/b/c
xu read-p 0 "/t/a: 1${NL}" - xenstore-read -p /t/a
xu list 0 "a${NL}b${NL}" - xenstore-list /t
xu ls-f 0 "/t/a = \"1\"${NL}/t/b = \"\"${NL}/t/b/c = \"two words\"${NL}" - xenstore-ls -f /t
xu exists 0 "" - xenstore-exists /t/b/c
xu exists-missing 1 "" - xenstore-exists /t/nope
xu read-missing 1 "" "xenstore-read: couldn't read path /t/nope" xenstore-read /t/nope
xu rm-absent-child 0 "" - xenstore-rm /t/absent
xu rm-missing-parent 1 "" "xenstore-rm: could not remove path /t/x/y" xenstore-rm /t/x/y
xu rm 0 "" - xenstore-rm /t/b
xu list-after-rm 0 "a${NL}" - xenstore-list /t
xu write-q 0 "" - xenstore-write /q/r/s x
xu rm-t 0 "" - xenstore-rm -t /q/r/s
xu rm-t-gone 1 "" - xenstore-exists /q
$XT/xenstore-ls -f > /tmp/xu.all 2>&1
for l in '/tool = ""' '/tool/xenstored = ""' '/local/domain/0/name = "Domain-0"' '/local/domain/0/domid = "0"'; do
  if grep -qxF "$l" /tmp/xu.all; then result "xsutil-tree-$(echo "$l" | cut -d' ' -f1 | tr / _)" PASS
  else result "xsutil-tree-$(echo "$l" | cut -d' ' -f1 | tr / _)" FAIL "missing [$l]"; fi
done
grep -E '^/tool|^/local/domain/0/' /tmp/xu.all | head -n 20 | sed 's/^/  [xsutil] ls -f: /'
# watch: registration event, a write below, nothing for elsewhere, rm
$XT/xenstore-write /w ""
$XT/xenstore-watch -n 3 /w > /tmp/xu.watch 2>&1 &
WP=$!
sleep 2
$XT/xenstore-write /w/x 1; sleep 1
$XT/xenstore-write /elsewhere 1; $XT/xenstore-rm /w/x
wait_until 10 sh -c "! kill -0 $WP"; kill $WP 2>/dev/null
sed 's/^/  [xsutil] watch: /' /tmp/xu.watch
if [ "$(cat /tmp/xu.watch)" = "/w${NL}/w/x${NL}/w/x" ]; then result xsutil-watch PASS
else result xsutil-watch FAIL "real: [$(tr '\n' '|' < /tmp/xu.watch)]; sim test expects [/w|/w/x|/w/x]"; fi
# concurrent writers all commit
_p=""; for i in 0 1 2 3 4 5; do $XT/xenstore-write /c/k$i v /c/j$i w & _p="$_p $!"; done
_f=0; for p in $_p; do wait $p || _f=$((_f + 1)); done
_c=$($XT/xenstore-list /c | wc -l)
if [ $_f = 0 ] && [ "$_c" = 12 ]; then result xsutil-concurrent PASS
else result xsutil-concurrent FAIL "failed writers=$_f children=$_c (sim test expects 0 and 12)"; fi
