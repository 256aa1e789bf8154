#!/usr/bin/env bash
# SPDX-License-Identifier: MIT OR Apache-2.0
# The xensock BTL under mpirun, ranks in two domains of the simulated host
# (with its dom0 agent), Open MPI allowed only `self,xensock` so xensock
# carries everything between the domains:
#   - the BTL is selected for the other domain's rank (verbose output);
#   - xsmpi check (every size 1 B .. 4 MiB both ways, ring, Allreduce,
#     Bcast, all bytes verified);
#   - NetPIPE's integrity mode (NPopenmpi -i) and mpi4py's ringtest,
#     programs nobody here wrote;
#   - two ranks per domain (self,vader,xensock);
#   - a stranger writing garbage to a rank's port: dropped, the job goes on;
#   - a rank's guest destroyed mid-job: the other rank's BTL reports the
#     lost peer through Open MPI's error callback and the job ends, never
#     hangs.
# Usage: mpi/tests/sim.sh   (from the repository root; builds what it needs)
set -euo pipefail
cd "$(dirname "$0")/../.."

fail() { echo "FAIL: $*" >&2; exit 1; }
pass() { echo "PASS: $*"; }

for tool in mpirun mpicc ompi_info NPopenmpi; do
  command -v "$tool" >/dev/null || fail "$tool missing (apt-get install openmpi-bin libopenmpi-dev netpipe-openmpi python3-mpi4py)"
done

make -s -C mpi PROFILE=debug >/dev/null
cargo build -q --locked -p xensock-sim -p xensock-discovery -p libxensock --features libxensock/cli
work=$(mktemp -d /tmp/xensock-mpi.XXXXXX)
sim_pid=
cleanup() {
  pkill -f "xensock daemon.*" -P $$ 2>/dev/null || true
  [ -n "$sim_pid" ] && kill "$sim_pid" 2>/dev/null || true
  sleep 0.2
  [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
mpicc -O2 -Wall -o "$work/xsmpi" mpi/tests/xsmpi.c

# The sim reads commands on stdin; a FIFO held open keeps it running.
mkfifo "$work/sim.in"
target/debug/xensock-sim up 2 --agent --dir "$work/host" <"$work/sim.in" >"$work/sim.log" 2>&1 &
sim_pid=$!
exec 9>"$work/sim.in"
for _ in $(seq 100); do [ -S "$work/host/dom2/xenstored.sock" ] && break; sleep 0.1; done
[ -S "$work/host/dom2/xenstored.sock" ] || fail "simulated host did not start: $(cat "$work/sim.log")"

in_domain() { echo env XENSOCK_SIM="$work/host" XENSOCK_SIM_DOMID="$1" XENSTORED_PATH="$work/host/dom$1/xenstored.sock"; }
for d in 1 2; do $(in_domain $d) target/debug/xensock-discover advertise --addr "10.9.0.$d" >/dev/null; done
for _ in $(seq 50); do
  $(in_domain 1) target/debug/xensock-discover peers 2>/dev/null | grep -q '^dom2' && break
  sleep 0.1
done

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
pkglibdir=$(ompi_info --path pkglibdir --parsable | cut -d: -f3)
export OMPI_MCA_mca_base_component_path="$pkglibdir:$PWD/mpi"
# Two ranks, one per domain: rank 0 in domain 1, rank 1 in domain 2.
two() { local per=${PER:-1}; timeout "${LIMIT:-300}" mpirun --mca btl "${BTLS:-self,xensock}" "$@" \
  -np "$per" $(in_domain 1) "${prog[@]}" : -np "$per" $(in_domain 2) "${prog[@]}"; }

prog=("$work/xsmpi" check)
two --mca btl_base_verbose 10 >"$work/check.log" 2>&1 || { tail -30 "$work/check.log"; fail "xsmpi check"; }
[ "$(grep -c 'Using xensock btl for send to' "$work/check.log")" -eq 2 ] \
  || { grep btl "$work/check.log" | tail; fail "xensock not selected by both ranks"; }
grep -q 'btl:xensock: listening: domain 1 port .* over user-space transport' "$work/check.log" || fail "no listening line"
grep -q '^xsmpi check ok' "$work/check.log" || fail "xsmpi check printed no result"
pass "xsmpi check over self,xensock: $(grep '^xsmpi check ok' "$work/check.log")"

prog=(NPopenmpi -i -n 20 -u 1048576 -o "$work/np.out")
two >"$work/np.log" 2>&1 || { tail -20 "$work/np.log"; fail "NPopenmpi -i"; }
grep -qi 'error\|fail' "$work/np.log" && { tail -20 "$work/np.log"; fail "NPopenmpi integrity errors"; }
pass "NPopenmpi integrity check up to 1 MiB ($(grep -c . "$work/np.out") sizes)"

prog=(/usr/bin/python3 -m mpi4py.bench ringtest -n 65536 -l 200)
if /usr/bin/python3 -c 'import mpi4py' 2>/dev/null; then
  two >"$work/ring.log" 2>&1 || { tail -20 "$work/ring.log"; fail "mpi4py ringtest"; }
  pass "mpi4py ringtest: $(grep -i time "$work/ring.log" | head -1)"
else
  fail "python3-mpi4py missing"
fi

# Several processes of one guest share its user-space transport through
# `xensock daemon` (the transport itself is one process per guest).
daemon_env() { echo XENSOCK_DAEMON_SOCKET="$work/daemon$1.sock"; }
for d in 1 2; do
  $(in_domain $d) $(daemon_env $d) target/debug/xensock daemon >"$work/daemon$d.log" 2>&1 &
done
for _ in $(seq 100); do [ -S "$work/daemon1.sock" ] && [ -S "$work/daemon2.sock" ] && break; sleep 0.1; done
in_domain() { echo env XENSOCK_SIM="$work/host" XENSOCK_SIM_DOMID="$1" XENSTORED_PATH="$work/host/dom$1/xenstored.sock" $(daemon_env "$1"); }
# Every simulated domain is this one machine, so vader could reach every
# rank; below xensock's exclusivity it keeps to the pairs xensock refuses
# (the same domain), as on real guests, where vader cannot cross a guest.
prog=("$work/xsmpi" check --max 262144)
PER=2 BTLS=self,vader,xensock two --mca btl_vader_exclusivity 512 --mca btl_base_verbose 10 >"$work/four.log" 2>&1 \
  || { tail -30 "$work/four.log"; fail "two ranks per domain"; }
[ "$(grep -c 'Using xensock btl for send to' "$work/four.log")" -eq 8 ] \
  || { grep 'Using' "$work/four.log"; fail "four ranks: want 8 xensock pairs"; }
[ "$(grep -c 'Using vader btl for send to' "$work/four.log")" -eq 4 ] \
  || { grep 'Using' "$work/four.log"; fail "four ranks: want vader inside each domain"; }
pass "two ranks per domain: vader inside, xensock across ($(grep '^xsmpi check ok' "$work/four.log"))"

# A stranger connecting to a rank's BTL port and writing garbage is cut
# off with a note, and the job goes on unharmed.
prog=("$work/xsmpi" soak --seconds 4)
LIMIT=120 two --mca btl_base_verbose 10 >"$work/garbage.log" 2>&1 &
job=$!
port=
for _ in $(seq 100); do
  port=$(sed -n 's/.*btl:xensock: listening: domain 1 port \([0-9]*\) .*/\1/p' "$work/garbage.log" | head -1)
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "$port" ] || fail "no listening line from rank 0"
printf 'GARBAGE, NOT A HELLO: %064d' 0 | timeout 20 $(in_domain 2) target/debug/xensock connect "xen:1:$port" \
  >/dev/null 2>&1 || true
rc=0; wait "$job" || rc=$?
[ "$rc" -eq 0 ] && grep -q '^xsmpi soak ok' "$work/garbage.log" \
  || { tail -20 "$work/garbage.log"; fail "the job did not survive a garbage connection"; }
grep -q 'btl:xensock: dropped a connection: protocol error from the peer: the connection does not start with a BTL hello' \
  "$work/garbage.log" || { grep btl:xensock "$work/garbage.log" | tail; fail "the garbage connection was not refused"; }
pass "a garbage connection to rank 0's port is dropped with a note and the job completes"

# A rank's guest destroyed mid-job: a BTL must report the lost peer (through Open MPI's error callback, which aborts the job), well
# within the time limit, never hang. (A killed process would do too, but
# ORTE sees that death itself and may end the job first.)
prog=("$work/xsmpi" soak --seconds 60)
LIMIT=90 two >"$work/lost.log" 2>&1 &
job=$!
for _ in $(seq 100); do pgrep -f "$work/xsmpi soak" >/dev/null && break; sleep 0.1; done
sleep 2
start=$(date +%s)
echo "destroy 2" >&9
rc=0; wait "$job" || rc=$?
took=$(( $(date +%s) - start ))
[ "$rc" -ne 124 ] || { tail -20 "$work/lost.log"; fail "job whose peer guest was destroyed hung"; }
[ "$rc" -ne 0 ] || { tail -20 "$work/lost.log"; fail "job whose peer guest was destroyed exited 0"; }
# (the rank in the destroyed domain loses its connections too, and
# whichever reports first ends the job)
grep -q 'btl:xensock: xensock: rank .*: lost the peer' "$work/lost.log" \
  || { tail -20 "$work/lost.log"; fail "no BTL reported the lost peer"; }
pass "a rank's guest destroyed mid-job: the BTL reported it ($(grep -o 'lost the peer: .*' "$work/lost.log" | head -1)), job ended with status $rc after ${took}s"
echo "mpi sim: all passed"
