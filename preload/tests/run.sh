#!/usr/bin/env bash
# SPDX-License-Identifier: MIT OR Apache-2.0
# Real programs nobody here wrote, and the C cases (tests/cases.c), under
# libxensock_preload.so on loopback: each must work exactly as without it.
# Loopback is never another guest, so everything stays on TCP; the
# decision log (XENSOCK_PRELOAD_LOG) must show that the library saw the
# programs' connects and listens, or the run proves nothing.
#   preload/tests/run.sh PATH/TO/libxensock_preload.so
set -euo pipefail
lib=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
log=$work/decisions.log
export XENSOCK_PRELOAD_LOG=$log
pre() { LD_PRELOAD=$lib "$@"; }
# a server in the background: $! is the program itself, so kill reaches it
bg() { LD_PRELOAD=$lib "$@" & pids+=($!); }
fail() { echo "FAIL $*"; exit 1; }
# a free port: ask the kernel for one and give it back
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
seen() { # PATTERN: the library logged a decision matching it
  grep -q -- "$1" "$log" || fail "the library saw no '$1' (is it preloaded?)"
}

echo "--- C cases (fork, exec, dup2/dup3, fds >= 1024, threads, epoll before connect)"
cc -O2 -pthread -o "$work/cases" "$here/cases.c"
pre "$work/cases"
seen "connect fd 1500 to 127.0.0.1"

echo "--- redis-server + redis-benchmark"
port=$(free_port)
bg redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize no \
  --dir "$work" --logfile "$work/redis.log"
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
out=$(pre redis-benchmark -p "$port" -n 20000 -c 20 -q -t set,get | tr '\r' '\n')
grep -E "^(SET|GET): [0-9.]+ requests per second" <<<"$out" || true
grep -qE "^SET: [0-9.]+ requests per second" <<<"$out" || fail "redis-benchmark SET"
grep -qE "^GET: [0-9.]+ requests per second" <<<"$out" || fail "redis-benchmark GET"
[ "$(pre redis-cli -p "$port" set preloaded yes)" = OK ] || fail "redis-cli set"
[ "$(pre redis-cli -p "$port" get preloaded)" = yes ] || fail "redis-cli get"
seen "listen fd .* on 127.0.0.1:$port"
seen "connect fd .* to 127.0.0.1:$port"

echo "--- nginx (2 workers, sendfile on) + curl"
port=$(free_port)
mkdir -p "$work/www" "$work/nginx"
head -c $((4 << 20)) /dev/urandom > "$work/www/file"
user=""
[ "$(id -u)" = 0 ] && user="user root;"
cat > "$work/nginx/nginx.conf" <<CONF
$user
worker_processes 2;
daemon off;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log;
events { worker_connections 64; }
http {
  sendfile on;
  access_log off;
  client_body_temp_path $work/nginx;
  proxy_temp_path $work/nginx;
  fastcgi_temp_path $work/nginx;
  uwsgi_temp_path $work/nginx;
  scgi_temp_path $work/nginx;
  server { listen 127.0.0.1:$port; root $work/www; }
}
CONF
bg nginx -c "$work/nginx/nginx.conf" -e "$work/nginx/error.log"
for _ in $(seq 50); do curl -s --noproxy '*' -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.1; done
for i in 1 2 3 4; do
  pre curl -s --noproxy '*' -o "$work/got" "http://127.0.0.1:$port/file"
  cmp -s "$work/got" "$work/www/file" || fail "nginx: fetch $i differs"
done
echo "4 fetches of 4 MiB, identical"
seen "listen fd .* on 127.0.0.1:$port"

echo "--- iperf3, both directions"
port=$(free_port)
bg iperf3 -s -p "$port" --one-off >/dev/null
sleep 0.5
pre iperf3 -c 127.0.0.1 -p "$port" -t 1 >"$work/iperf-up" || fail "iperf3 client"
grep -q "receiver" "$work/iperf-up" || fail "iperf3: no result"
bg iperf3 -s -p "$port" --one-off >/dev/null
sleep 0.5
pre iperf3 -c 127.0.0.1 -p "$port" -t 1 -R >"$work/iperf-down" || fail "iperf3 -R client"
grep -q "receiver" "$work/iperf-down" || fail "iperf3 -R: no result"
grep -hE "sender|receiver" "$work/iperf-up" "$work/iperf-down"
seen "connect fd .* to 127.0.0.1:$port"

echo "preload on loopback: every program unchanged"
