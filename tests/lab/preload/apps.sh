# Real TCP programs under the preload library (sourced by domu1.sh and
# domu2.sh after common.sh, which has `preloaded`): domu1 serves, domu2
# connects to domu1's address; every co-resident connection must go over
# AF_XEN, everything else over TCP, and the programs must not notice.
REDIS_PORT=6379
PLAIN_REDIS_PORT=6380   # redis-server without the library: the TCP baseline
NGINX_PORT=8080
REUSE_PORT=8081   # nginx with "listen ... reuseport": one listener per worker
IPERF_PORT=5201   # under the library: a dual listener
PLAIN_PORT=5202   # iperf3 without the library: AF_XEN clients get TCP
SELF_PORT=5203    # domu2's own iperf3 without the library: not co-resident
READY_PORT=7650   # AF_XEN: domu1's servers are up
DONE_PORT=7651    # AF_XEN: domu2's one-shot checks are done
CASES_PORT=7800   # preload/tests/cases.c's echo server, under the library
WWW=/tmp/www
# the programs run unprivileged (runas UT_UID) and write their files here
chmod 1777 /tmp

# the file nginx serves, made the same way on both sides to compare
make_file() { mkdir -p "$(dirname "$1")"; seq 1 300000 > "$1"; }

# afx_watch: while an AF_XEN connection of the long iperf3 (port
# IPERF_PORT) is established, a snapshot of /proc/net/af_xen and
# /proc/net/af_xen_tcp every 2 s, the last 8 kept in /tmp/afx-watch: what
# each side's switch held when a stream stood still (afx_watch_show)
afx_watch() {
  mkdir -p /tmp/afx-watch; rm -f /tmp/afx-watch/* /tmp/afx-watch.stop
  (
    n=0
    while [ ! -e /tmp/afx-watch.stop ]; do
      if grep -q "^ESTABLISHED.*:$IPERF_PORT\b" /proc/net/af_xen 2> /dev/null; then
        { echo "uptime $(cut -d' ' -f1 /proc/uptime)"; cat /proc/net/af_xen /proc/net/af_xen_tcp; } \
          > "/tmp/afx-watch/$((n % 8))" 2>&1
        n=$((n + 1))
      fi
      lab_sleep 2
    done
  ) &
}
afx_watch_show() {
  touch /tmp/afx-watch.stop
  for f in $(ls -tr /tmp/afx-watch/* 2> /dev/null); do sed 's/^/  [af_xen watch] /' "$f"; done
}

# ---- domu1 -------------------------------------------------------------------
apps_servers() {
  make_file "$WWW/file"
  mkdir -p /tmp/nginx/logs /tmp/nginx/tmp
  chown -R "$UT_UID" /tmp/nginx "$WWW"
  cat > /tmp/nginx/nginx.conf <<CONF
worker_processes 2;
daemon off;
pid /tmp/nginx/nginx.pid;
error_log /tmp/nginx/logs/error.log;
events { worker_connections 64; }
http {
  include /opt/xensock/nginx/mime.types;
  sendfile on;
  log_format pid '\$pid \$remote_addr \$status \$body_bytes_sent';
  access_log /tmp/nginx/logs/access.log pid;
  client_body_temp_path /tmp/nginx/tmp/body;
  proxy_temp_path /tmp/nginx/tmp/proxy;
  fastcgi_temp_path /tmp/nginx/tmp/fastcgi;
  uwsgi_temp_path /tmp/nginx/tmp/uwsgi;
  scgi_temp_path /tmp/nginx/tmp/scgi;
  server { listen $NGINX_PORT; root $WWW; }
  server { listen $REUSE_PORT reuseport; root $WWW; access_log /tmp/nginx/logs/reuseport.log pid; }
}
CONF
  preloaded redis-server --port $REDIS_PORT --bind 0.0.0.0 --protected-mode no --save "" \
    --appendonly no --daemonize no --dir /tmp > /tmp/redis.log 2>&1 &
  preloaded nginx -p /tmp/nginx -c /tmp/nginx/nginx.conf -e /tmp/nginx/logs/error.log > /tmp/nginx.out 2>&1 &
  preloaded iperf3 -s -p $IPERF_PORT > /tmp/iperf3-s.log 2>&1 &
  afx_watch
  preloaded /opt/xensock/bin/cases --serve $CASES_PORT > /tmp/cases-s.log 2>&1 &
  runas "$UT_UID" iperf3 -s -p $PLAIN_PORT > /tmp/iperf3-plain.log 2>&1 &
  runas "$UT_UID" redis-server --port $PLAIN_REDIS_PORT --bind 0.0.0.0 --protected-mode no --save "" \
    --appendonly no --daemonize no --dir /tmp > /tmp/redis-plain.log 2>&1 &
  # every listener became a dual listener (the library's log, in each
  # program's output) before domu2 is told to go
  check app-servers wait_until 60 sh -c "grep -q 'on 0.0.0.0:$REDIS_PORT: TCP clients and co-resident' /tmp/redis.log &&
    grep -q 'on 0.0.0.0:$NGINX_PORT: TCP clients and co-resident' /tmp/nginx.out &&
    [ \$(grep -c 'on 0.0.0.0:$REUSE_PORT: TCP clients and co-resident' /tmp/nginx.out) -ge 2 ] &&
    grep -q ':$IPERF_PORT: TCP clients and co-resident' /tmp/iperf3-s.log &&
    grep -q 'on 0.0.0.0:$CASES_PORT: TCP clients and co-resident' /tmp/cases-s.log"
  sed "s/^/  [af_xen] /" /proc/net/af_xen
  # the servers are up: an AF_XEN listener says so to domu2 (which cannot
  # read our XenStore home)
  xsstream echo $READY_PORT > /dev/null 2>&1 &
}
# domu1 holds its phase (and so the move) until domu2's one-shot checks are done
apps_wait_client() {
  wait_until 900 sh -c "d=\$(xsstream resolve $LAB_NET_DOMU2) && xsstream ping \$d $DONE_PORT done > /dev/null 2>&1" ||
    log "domu2 never said its one-shot checks were done"
}
apps_servers_finish() {
  # with "reuseport" each worker has its own listener; co-resident clients
  # went to both
  _pids=$(awk '{print $1}' /tmp/nginx/logs/reuseport.log 2>/dev/null | sort -u | wc -l)
  _reqs=$(wc -l < /tmp/nginx/logs/reuseport.log 2>/dev/null)
  if [ "${_pids:-0}" -ge 2 ]; then result app-nginx-reuseport PASS "$_reqs requests served by $_pids workers' own listeners"
  else result app-nginx-reuseport FAIL "$_reqs requests served by ${_pids:-0} worker(s)"; fi
  # nginx's two worker processes both accepted from the one listener
  _pids=$(awk '{print $1}' /tmp/nginx/logs/access.log 2>/dev/null | sort -u | wc -l)
  _reqs=$(wc -l < /tmp/nginx/logs/access.log 2>/dev/null)
  if [ "${_pids:-0}" -ge 2 ]; then result app-nginx-prefork PASS "$_reqs requests served by $_pids workers"
  else result app-nginx-prefork FAIL "$_reqs requests served by ${_pids:-0} worker(s)"; fi
  for f in /tmp/redis.log /tmp/nginx.out /tmp/nginx/logs/error.log /tmp/iperf3-s.log; do
    tail -n 20 "$f" 2>/dev/null | sed "s|^|  [$(basename "$f")] |"
  done
  # a test that stood still (intervals with no byte): when it stopped, and
  # what this side's connections held at its end
  if [ "$(grep -c ' 0.00 Bytes ' /tmp/iperf3-s.log)" -ge 3 ]; then
    grep -E 'sec +[0-9.]+ [KMG]?Bytes' /tmp/iperf3-s.log | awk '{print $3, $5, $6}' | tr '\n' ' ' |
      sed 's/^/  [iperf3-s.log intervals] /'; echo
    afx_watch_show
  else
    touch /tmp/afx-watch.stop
  fi
}

# ---- domu2 -------------------------------------------------------------------
# on_af_xen NAME LOG: the library's log says every connect went over AF_XEN
on_af_xen() {
  _x=$(grep -c "AF_XEN to dom" "$2"); _t=$(grep -c "stays on TCP" "$2")
  if [ "$_x" -gt 0 ] && [ "$_t" = 0 ]; then result "$1" PASS "$_x connects over AF_XEN, none on TCP"
  else result "$1" FAIL "$_x connects over AF_XEN, $_t on TCP: $(grep -m 1 'stays on TCP' "$2")"; fi
}
# proc_sample PORT OUT: /proc/net/af_xen rows of TCP programs' connections
# to domu1:PORT, sampled every 0.2 s until the caller's program ends
proc_sample() {
  : > "$2"
  while [ ! -e /tmp/sample.stop ]; do
    grep " $LAB_NET_DOMU1:$1\$" /proc/net/af_xen >> "$2"; lab_sleep 0.2
  done
  rm -f /tmp/sample.stop
}
# tcp_fallback NAME ADDR PORT WHY: iperf3 under the library to ADDR:PORT
# works, over TCP, for the reason WHY (the library's log)
tcp_fallback() {
  preloaded iperf3 -c "$2" -p "$3" -t 2 > /tmp/ip-fb.out 2> /tmp/ip-fb.err
  _rc=$?
  if [ $_rc = 0 ] && grep "stays on TCP" /tmp/ip-fb.err | grep -q "$4"; then
    result "$1" PASS "over TCP: $4"
  else
    result "$1" FAIL "iperf3 exit $_rc; $(tail -n 1 /tmp/ip-fb.err)"
  fi
}
apps_once() {
  check app-servers-seen wait_until 300 sh -c \
    "d=\$(xsstream resolve $LAB_NET_DOMU1) && xsstream ping \$d $READY_PORT ready > /dev/null 2>&1"
  # redis
  preloaded redis-benchmark -h "$LAB_NET_DOMU1" -p $REDIS_PORT -n 4000 -c 4 -q -t set,get \
    > /tmp/rb.out 2> /tmp/rb.err
  tr '\r' '\n' < /tmp/rb.out | grep -E '^(SET|GET):' | tail -n 2 | sed 's/^/  [redis-benchmark] /'
  check app-redis sh -c "tr '\r' '\n' < /tmp/rb.out | grep -qE '^SET: [0-9.]+ requests per second' &&
    tr '\r' '\n' < /tmp/rb.out | grep -qE '^GET: [0-9.]+ requests per second'"
  on_af_xen app-redis-on-af-xen /tmp/rb.err
  # nginx (sendfile) + curl: one fetch, then 16 in parallel (both of
  # nginx's workers accept from the one listener)
  make_file /tmp/want
  : > /tmp/curl.err; : > /tmp/curl.out; _ok=0; _n=17
  # (each waited for by pid: a bare `wait` would wait for the advertiser too)
  _pids=
  for i in $(seq $_n); do
    ( preloaded curl -s --max-time 60 -o "/tmp/got.$i" -w "fetch $i: %{http_code} %{size_download} bytes %{time_total} s\n" \
        "http://$LAB_NET_DOMU1:$NGINX_PORT/file" >> /tmp/curl.out 2>> /tmp/curl.err ) &
    if [ "$i" = 1 ]; then wait $!; else _pids="$_pids $!"; fi
  done
  for p in $_pids; do wait "$p"; done
  for i in $(seq $_n); do cmp -s /tmp/want "/tmp/got.$i" && _ok=$((_ok + 1)); rm -f "/tmp/got.$i"; done
  if [ $_ok = $_n ]; then result app-nginx PASS "$_n fetches of $(wc -c < /tmp/want) bytes, identical"
  else
    result app-nginx FAIL "$_ok of $_n fetches identical"
    sed 's/^/  [curl] /' /tmp/curl.out; grep -v "AF_XEN to dom" /tmp/curl.err | sed 's/^/  [curl] /'
  fi
  on_af_xen app-nginx-on-af-xen /tmp/curl.err
  # the SO_REUSEPORT listeners: 8 fetches at once
  : > /tmp/curl-r.err; _ok=0; _pids=
  for i in $(seq 8); do
    ( preloaded curl -s --max-time 60 -o "/tmp/gotr.$i" "http://$LAB_NET_DOMU1:$REUSE_PORT/file" 2>> /tmp/curl-r.err ) &
    _pids="$_pids $!"
  done
  for p in $_pids; do wait "$p"; done
  for i in $(seq 8); do cmp -s /tmp/want "/tmp/gotr.$i" && _ok=$((_ok + 1)); rm -f "/tmp/gotr.$i"; done
  if [ $_ok = 8 ]; then result app-nginx-reuseport-fetch PASS "8 fetches identical"
  else result app-nginx-reuseport-fetch FAIL "$_ok of 8 fetches identical"; fi
  on_af_xen app-nginx-reuseport-on-af-xen /tmp/curl-r.err
  # iperf3 both ways, its connections seen in /proc/net/af_xen meanwhile
  : > /tmp/ip.err
  proc_sample $IPERF_PORT /tmp/ip.proc &
  _sampler=$!
  for d in up down; do
    _r=; [ $d = down ] && _r=-R
    preloaded iperf3 -c "$LAB_NET_DOMU1" -p $IPERF_PORT -t 3 -f m $_r > "/tmp/ip-$d.out" 2>> /tmp/ip.err
    _rc=$?
    if [ $_rc = 0 ]; then result "app-iperf3-$d" PASS "$(awk '/receiver/ {print $7, $8}' "/tmp/ip-$d.out")"
    else result "app-iperf3-$d" FAIL "iperf3 exit $_rc: $(grep -m 1 error "/tmp/ip-$d.out")"; fi
  done
  touch /tmp/sample.stop; wait "$_sampler"
  grep -h -E 'sender|receiver' /tmp/ip-up.out /tmp/ip-down.out | sed 's/^/  [iperf3] /'
  metric app.iperf3_up_mbit "$(awk '/receiver/ {print $7}' /tmp/ip-up.out)" Mbit/s
  metric app.iperf3_down_mbit "$(awk '/receiver/ {print $7}' /tmp/ip-down.out)" Mbit/s
  _rows=$(grep -c ESTABLISHED /tmp/ip.proc)
  _x=$(grep -c "AF_XEN to dom" /tmp/ip.err); _t=$(grep -c "stays on TCP" /tmp/ip.err)
  if [ "$_rows" -gt 0 ] && [ "$_x" -ge 4 ] && [ "$_t" = 0 ]; then
    result app-iperf3-on-af-xen PASS "$_x connects over AF_XEN; /proc/net/af_xen showed them ($_rows samples)"
  else
    result app-iperf3-on-af-xen FAIL "$_x connects over AF_XEN, $_t on TCP, $_rows /proc/net/af_xen samples"
  fi
  # what TCP programs do with their sockets, on redirected ones: a
  # non-blocking connect registered in epoll first (EINPROGRESS, then the
  # EPOLLOUT edge), fds >= 1024 with poll, dup2/dup3, fork, exec of a
  # program that uses the inherited socket, 8 threads x 50 connects
  preloaded /opt/xensock/bin/cases --connect "$LAB_NET_DOMU1" $CASES_PORT > /tmp/cases.out 2> /tmp/cases.err
  while read -r v name rest; do
    case $v in
      ok) result "app-case-$name" PASS ;;
      FAIL) result "app-case-${name%:}" FAIL "$rest" ;;
    esac
  done < /tmp/cases.out
  on_af_xen app-cases-on-af-xen /tmp/cases.err
  # a server that does not run the library, and an address no
  # co-resident guest has (this guest's own): over TCP, and working
  tcp_fallback app-not-preloaded-server-tcp "$LAB_NET_DOMU1" $PLAIN_PORT "does not listen on AF_XEN port $PLAIN_PORT"
  runas "$UT_UID" iperf3 -s -1 -p $SELF_PORT > /dev/null 2>&1 &
  lab_sleep 1
  tcp_fallback app-not-co-resident-tcp "$LAB_NET_DOMU2" $SELF_PORT "no co-resident guest has $LAB_NET_DOMU2"
  apps_bench
  # done: domu1 may start the move's phase (an AF_XEN listener says so)
  xsstream echo $DONE_PORT > /dev/null 2>&1 &
}

# While domu1 is saved and restored: rounds of redis-benchmark INCR (4
# connections each) and one long iperf3, all started before the move.
RB_ROUND=20000
apps_during_start() {
  rm -f /tmp/apps.stop; echo 0 > /tmp/rb.rounds; : > /tmp/rb-move.err
  preloaded redis-cli -h "$LAB_NET_DOMU1" -p $REDIS_PORT del counter:__rand_int__ > /dev/null 2>&1
  (
    n=0
    while [ ! -e /tmp/apps.stop ]; do
      preloaded redis-benchmark -h "$LAB_NET_DOMU1" -p $REDIS_PORT -n $RB_ROUND -c 4 -q -t incr \
        > /tmp/rb-move.out 2>> /tmp/rb-move.err || { echo "round $((n + 1)) failed" >> /tmp/rb-move.err; break; }
      n=$((n + 1)); echo $n > /tmp/rb.rounds
    done
  ) &
  RB_LOOP=$!
  preloaded iperf3 -c "$LAB_NET_DOMU1" -p $IPERF_PORT -t 120 -f m > /tmp/ip-move.out 2> /tmp/ip-move.err &
  IP_MOVE=$!
  afx_watch
}
apps_during_check() {
  touch /tmp/apps.stop
  wait "$RB_LOOP"
  _rounds=$(cat /tmp/rb.rounds); _want=$((_rounds * RB_ROUND))
  _got=$(preloaded redis-cli -h "$LAB_NET_DOMU1" -p $REDIS_PORT get counter:__rand_int__ 2> /dev/null)
  if [ "$_rounds" -gt 0 ] && ! grep -qi -e error -e failed /tmp/rb-move.err; then
    result app-redis-across-move PASS "$_rounds rounds of $RB_ROUND INCRs, $(grep -c 'AF_XEN to dom' /tmp/rb-move.err) connects over AF_XEN, $(grep -c 'stays on TCP' /tmp/rb-move.err) on TCP"
  else
    result app-redis-across-move FAIL "$_rounds rounds; $(grep -i -m 2 -e error -e failed /tmp/rb-move.err)"
  fi
  if [ "$_got" = "$_want" ]; then result app-redis-no-lost-request PASS "counter $_got = $_rounds x $RB_ROUND"
  else result app-redis-no-lost-request FAIL "counter '$_got', $_want INCRs done"; fi
  # the long iperf3's connections, if it still runs: back on a ring (a
  # row for domu1:IPERF_PORT whose carrier is ring-xen and that went back
  # to a ring at least once)
  # (a slow machine can reach this check after iperf3's 120 s: then the
  # newest afx_watch snapshot, taken in its last 2 s, is what it saw)
  _on_ring() {
    awk -v p=" $LAB_NET_DOMU1:$IPERF_PORT\$" '$1 == "ESTABLISHED" && $0 ~ p && $10 == "ring-xen" && $12 >= 1' "$1" | wc -l
  }
  _snap=$(ls -t /tmp/afx-watch/* 2> /dev/null | head -n 1)
  if kill -0 "$IP_MOVE" 2> /dev/null; then _ring=$(_on_ring /proc/net/af_xen); _seen=now
  elif [ -n "$_snap" ]; then _ring=$(_on_ring "$_snap"); _seen="in its last snapshot ($(head -n 1 "$_snap"))"
  else _ring=0; _seen="never (iperf3 ended, no snapshot)"; fi
  if [ "$_ring" -gt 0 ]; then result app-iperf3-back-on-ring PASS "$_ring connection(s) back on a ring, $_seen"
  else result app-iperf3-back-on-ring FAIL "no connection to $LAB_NET_DOMU1:$IPERF_PORT back on a ring, $_seen"
    sed 's/^/  [af_xen] /' /proc/net/af_xen; fi
  wait "$IP_MOVE"; _rc=$?
  grep -E 'sender|receiver|error' /tmp/ip-move.out | sed 's/^/  [iperf3 across the move] /'
  if [ $_rc = 0 ] && grep -q receiver /tmp/ip-move.out; then
    result app-iperf3-across-move PASS "$(awk '/receiver/ {print $5, $6, "in", $3, "s"}' /tmp/ip-move.out)"
  else
    result app-iperf3-across-move FAIL "iperf3 exit $_rc: $(grep -m 1 error /tmp/ip-move.out) $(tail -n 1 /tmp/ip-move.err)"
    grep -E 'sec +[0-9.]+ [KMG]?Bytes' /tmp/ip-move.out | awk '{print $3, $5, $6}' | tr '\n' ' ' |
      sed 's/^/  [iperf3 across the move intervals] /'; echo
    afx_watch_show
  fi
  touch /tmp/afx-watch.stop
}

# ---- the benchmark: the same programs under the library (AF_XEN) and
# without it (TCP over netfront), interleaved rounds in one run; medians
# and their ratios as metrics (lab/tools/bench-ratios prints them too)
# (PRELOAD_BENCH_ROUNDS in the host environment; scripts/test runs one)
. /opt/xensock/preload.params
BENCH_SECS=5
BENCH_REQS=5000
# rps KIND FILE: redis-benchmark -q's requests per second for SET or GET
rps() { tr '\r' '\n' < "$2" | awk -v k="$1:" '$1 == k {print $2}' | tail -n 1; }
median() { sort -n | awk '{v[NR] = $1} END {if (NR) print v[int((NR + 1) / 2)]; else print 0}'; }
apps_bench() {
  : > /tmp/bench.tsv
  for r in $(seq "$BENCH_ROUNDS"); do
    for way in afxen tcp; do
      if [ $way = afxen ]; then run=preloaded; ip_port=$IPERF_PORT; rd_port=$REDIS_PORT
      else run="runas $UT_UID"; ip_port=$PLAIN_PORT; rd_port=$PLAIN_REDIS_PORT; fi
      $run iperf3 -c "$LAB_NET_DOMU1" -p $ip_port -t $BENCH_SECS -f m > /tmp/b-ip.out 2> /dev/null &&
        printf 'iperf3_mbit\t%s\t%s\n' $way "$(awk '/receiver/ {print $7}' /tmp/b-ip.out)" >> /tmp/bench.tsv
      $run redis-benchmark -h "$LAB_NET_DOMU1" -p $rd_port -n $BENCH_REQS -c 8 -q -t set,get > /tmp/b-rd.out 2> /dev/null &&
        printf 'redis_set_rps\t%s\t%s\nredis_get_rps\t%s\t%s\n' $way "$(rps SET /tmp/b-rd.out)" $way "$(rps GET /tmp/b-rd.out)" >> /tmp/bench.tsv
    done
  done
  sed 's/^/  [bench round] /' /tmp/bench.tsv
  log "bench ($BENCH_ROUNDS rounds, medians): under the preload library (AF_XEN) / without it (TCP over netfront)"
  for m in iperf3_mbit redis_set_rps redis_get_rps; do
    _x=$(awk -v m=$m '$1 == m && $2 == "afxen" {print $3}' /tmp/bench.tsv | median)
    _t=$(awk -v m=$m '$1 == m && $2 == "tcp" {print $3}' /tmp/bench.tsv | median)
    _u=${m##*_}
    metric "bench.${m%_*}_afxen" "$_x" "$_u"
    metric "bench.${m%_*}_tcp" "$_t" "$_u"
    metric "bench.${m%_*}_ratio" "$(awk -v x="$_x" -v t="$_t" 'BEGIN {if (t > 0) printf "%.2f", x / t; else print 0}')" x
  done
}
