# shellcheck shell=bash
# Boot Xen + dom0 (+ domUs) under QEMU TCG, follow the console, and never
# leave QEMU behind: every QEMU runs under `timeout`, its PID is recorded,
# and the EXIT trap kills exactly those processes.
#
# HOSTS=2 (scenario.conf) boots two such machines, "a" and "b", joined by an
# inter-host network: each has an emulated e1000 NIC whose QEMU backend is a
# TCP socket between the two QEMUs (a listens on 127.0.0.1, b connects), and
# each dom0 puts that NIC on its xenbr0, so all dom0s and domUs of both
# machines share one Ethernet segment, 10.0.0.0/24. Host a's files are the
# single-host ones (console.log, qemu.pid); host b's have a "-b" suffix.

declare -A QEMU_WRAP_PIDS=() STAMP_PIDS=() QEMU_HWM_KB=()

host_sfx() { [[ $1 == a ]] && echo "" || echo "-$1"; }

kill_qemu() {
  local pidfile pid h
  for pidfile in "${RUN:-/nonexistent}"/qemu.pid "${RUN:-/nonexistent}"/qemu-?.pid; do
    [[ -s $pidfile ]] || continue
    pid=$(cat "$pidfile")
    # only a QEMU started by this run (its command line names our pidfile)
    if [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q -- "-pidfile $pidfile "; then
      kill "$pid" 2>/dev/null || true
      sleep 1
      kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
    fi
  done
  for h in "${!QEMU_WRAP_PIDS[@]}"; do
    pid=${QEMU_WRAP_PIDS[$h]}
    if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then kill "$pid" 2>/dev/null || true; fi
  done
}

boot_cleanup() {
  kill_qemu
  local h
  for h in "${!STAMP_PIDS[@]}"; do
    if kill -0 "${STAMP_PIDS[$h]}" 2>/dev/null; then kill "${STAMP_PIDS[$h]}" 2>/dev/null || true; fi
  done
  QEMU_WRAP_PIDS=(); STAMP_PIDS=()
}

# Lines worth showing while the machine runs (everything with -v).
progress_filter() {
  if [[ ${VERBOSE:-0} = 1 ]]; then cat; return; fi
  grep -aE '@@(PHASE|READY|RESULT|METRIC|EXIT|DONE)|\(XEN\) Xen version|Kernel panic|BUG:|Oops|Panic on CPU|FATAL|xl create|created \(domid' || true
}

# xenstored's request trace in dom0 (dom0-init's lab_xstrace): costly under
# TCG, so only for scenarios that read it (XS_TRACE=1 in their
# scenario.conf) or on request (LAB_XS_TRACE=1 in the environment; 0: never).
# LAB_XS_TRACE=ring runs xenstored verbose (-V: a line per message each
# way) into its own memory instead, written out only if it dies
# (lab/tools/xs-tracebuf.c).
xs_trace_arg() {
  if [[ ${LAB_XS_TRACE:-} = ring ]]; then echo " lab_xstrace=ring"; return 0; fi
  [[ -n ${LAB_XS_TRACE:-${XS_TRACE:-}} && ${LAB_XS_TRACE:-1} != 0 ]] && echo " lab_xstrace=1"
  return 0
}

# host_qemu_cmd HOST [interactive]: sets QEMU_CMD (array) and QEMU_MEM for HOST.
host_qemu_cmd() {
  local h=$1 interactive=${2:-} sfx; sfx=$(host_sfx "$h")
  local ndomus=$NDOMUS dom0_mem=$DOM0_MEM domus name=dom0 dom0_ip=10.0.0.1 uplink='' spare=0
  if [[ $h == b ]]; then
    ndomus=$HOSTB_NDOMUS; dom0_mem=$HOSTB_DOM0_MEM; name=dom0b; dom0_ip=10.0.0.2; spare=$HOSTB_SPARE_MEM
  fi
  domus=$( ((ndomus > 0)) && seq -s: -f 'domu%g' 1 "$ndomus" || true)
  # memory: dom0 + the domUs it boots + room for domUs it receives + Xen and slack
  QEMU_MEM=$(( dom0_mem + ndomus * DOMU_MEM + spare + 512 ))
  local xencmd="console=com1 com1=115200,8n1 dom0_mem=${dom0_mem}M,max:${dom0_mem}M dom0_max_vcpus=2 bootscrub=0 console_timestamps=boot loglvl=${XEN_LOGLVL:-warning} guest_loglvl=${XEN_LOGLVL:-warning}"
  ((HOSTS > 1)) && uplink=" lab_uplink=1"
  # the debug kernel: warnings on the console, slab red zones and poison
  # (lab/guest/dom0-init gives the domUs the same)
  local kargs="loglevel=${GUEST_LOGLEVEL:-4}"
  [[ $LAB_KERNEL != debug ]] || kargs="loglevel=${GUEST_LOGLEVEL:-5} slub_debug=FZPU kfence.sample_interval=10"
  local dom0cmd="console=hvc0 earlyprintk=xen $kargs lab_kernel=$LAB_KERNEL lab_guest=$LAB_GUEST${LAB_HAP:+ lab_hap=$LAB_HAP} rdinit=/init lab_name=$name lab_dom0_ip=$dom0_ip lab_domus=$domus lab_domu_mem=$DOMU_MEM lab_timeout=$GUEST_TIMEOUT$uplink${interactive:+ lab_shell=1}$(xs_trace_arg)"
  QEMU_CMD=(qemu-system-x86_64 -machine q35 -accel tcg -cpu qemu64,+svm,+npt
    -m "$QEMU_MEM" -smp 2 -nodefaults -display none -monitor none -serial stdio -no-reboot
    -pidfile "$RUN/qemu$sfx.pid"
    -kernel "$XEN_IMAGE" -append "$xencmd"
    -initrd "$KDIR/bzImage $dom0cmd,$RUN/dom0.cpio.gz")
  if ((HOSTS > 1)); then
    local sock=listen; [[ $h == a ]] || sock=connect
    QEMU_CMD+=(-netdev "socket,id=interhost,$sock=127.0.0.1:$INTERHOST_PORT"
      -device "e1000,netdev=interhost,mac=52:54:00:00:00:0$([[ $h == a ]] && echo a || echo b)")
  fi
}

# A free TCP port on 127.0.0.1 for the inter-host link.
pick_interhost_port() {
  local p
  for p in $(shuf -i 20000-60000 -n 20); do
    ss -Htln "sport = :$p" 2>/dev/null | grep -q . || { INTERHOST_PORT=$p; return 0; }
  done
  die "no free port for the inter-host network"
}

# start_host HOST: QEMU for HOST in the background, console stamped into
# $RUN/console<sfx>.log.
start_host() {
  local h=$1 sfx; sfx=$(host_sfx "$h")
  host_qemu_cmd "$h"
  printf '%q ' "${QEMU_CMD[@]}" > "$RUN/qemu$sfx.cmdline"; echo >> "$RUN/qemu$sfx.cmdline"
  rm -f "$RUN/qemu$sfx.pid" "$RUN/console$sfx.log" "$RUN/serial$sfx.fifo"
  say "QEMU${sfx:+ host $h}: TCG, ${QEMU_MEM} MiB, 2 vCPUs; timeout ${BOOT_TIMEOUT}s; console log: $RUN/console$sfx.log"
  mkfifo "$RUN/serial$sfx.fifo"
  # every console line stamped with seconds since QEMU start
  perl -MTime::HiRes=time -ne 'BEGIN{$|=1; $t0=time} s/\r//g; printf "[%8.2f] %s", time-$t0, $_' \
    < "$RUN/serial$sfx.fifo" > "$RUN/console$sfx.log" &
  STAMP_PIDS[$h]=$!
  timeout -k 10 "$BOOT_TIMEOUT" "${QEMU_CMD[@]}" < /dev/null > "$RUN/serial$sfx.fifo" 2>&1 &
  QEMU_WRAP_PIDS[$h]=$!
}

# boot [interactive]: runs the machine(s); sets BOOT_RC (QEMU's exit status;
# with two hosts, the first non-zero one) and BOOT_RCS[host].
declare -A BOOT_RCS=()
boot() {
  local interactive=${1:-}
  say "machine: dom0 ${DOM0_MEM} MiB, $NDOMUS domU x ${DOMU_MEM} MiB$( ((HOSTS > 1)) && echo "; host b: dom0 ${HOSTB_DOM0_MEM} MiB, $HOSTB_NDOMUS domU(s), room for $HOSTB_SPARE_MEM MiB more")"
  LOAD_START=$(cut -d' ' -f1 /proc/loadavg)

  if [[ -n $interactive ]]; then
    host_qemu_cmd a interactive
    printf '%q ' "${QEMU_CMD[@]}" > "$RUN/qemu.cmdline"; echo >> "$RUN/qemu.cmdline"
    BOOT_RC=0
    timeout -k 10 "$BOOT_TIMEOUT" "${QEMU_CMD[@]}" || BOOT_RC=$?
    return 0
  fi

  local hosts=(a) h
  if ((HOSTS > 1)); then
    hosts=(a b)
    pick_interhost_port
    say "inter-host network: e1000 NICs, QEMU socket netdev on 127.0.0.1:$INTERHOST_PORT"
  fi
  start_host a
  if ((HOSTS > 1)); then
    # b connects to a's listening socket: wait until a listens
    local n=0
    until ss -Htln "sport = :$INTERHOST_PORT" | grep -q .; do
      n=$((n + 1)); ((n < 100)) || die "host a's QEMU never listened on port $INTERHOST_PORT"
      kill -0 "${QEMU_WRAP_PIDS[a]}" 2>/dev/null || die "host a's QEMU exited before the network came up"
      sleep 0.1
    done
    start_host b
  fi

  declare -A shown=() done_at=()
  local total alive any log tag
  while :; do
    any=0
    for h in "${hosts[@]}"; do
      log=$RUN/console$(host_sfx "$h").log
      tag=; ((HOSTS > 1)) && tag="$h "
      alive=0; [[ -n ${QEMU_WRAP_PIDS[$h]:-} ]] && kill -0 "${QEMU_WRAP_PIDS[$h]}" 2>/dev/null && alive=1
      ((alive)) && any=1
      # host a runs the scenario: once it is gone, the others get 30 s
      if [[ $h == a ]] && ((!alive)) && [[ -z ${done_at[gone-a]:-} ]]; then done_at[gone-a]=$SECONDS; fi
      if [[ $h != a ]] && ((alive)) && [[ -n ${done_at[gone-a]:-} ]] && (( SECONDS - done_at[gone-a] > 30 )); then
        warn "machine $h still up 30 s after host a ended: killing its QEMU"; kill_host "$h"; done_at[gone-a]=$((SECONDS + 100000))
      fi
      [[ -f $log ]] || continue
      total=$(wc -l < "$log")
      if (( total > ${shown[$h]:-0} )); then
        sed -n "$((${shown[$h]:-0} + 1)),${total}p" "$log" | progress_filter | sed "s/^/  $tag| /"
        shown[$h]=$total
      fi
      ((alive)) || continue
      # peak resident memory of this QEMU (what a host really pays per machine)
      local qpid hwm
      qpid=$(cat "$RUN/qemu$(host_sfx "$h").pid" 2>/dev/null || true)
      hwm=$( [[ -n $qpid ]] && awk '/^VmHWM/ {print $2}' "/proc/$qpid/status" 2>/dev/null || true)
      [[ -z $hwm ]] || QEMU_HWM_KB[$h]=$hwm
      if [[ -z ${done_at[$h]:-} ]] && grep -aq '@@DONE' "$log"; then done_at[$h]=$SECONDS; fi
      if [[ -n ${done_at[$h]:-} ]] && (( SECONDS - done_at[$h] > 30 )); then
        warn "machine $h still up 30 s after @@DONE: killing its QEMU"; kill_host "$h"
      fi
    done
    ((any)) || break
    sleep 1
  done
  LOAD_END=$(cut -d' ' -f1 /proc/loadavg)
  BOOT_RC=0
  for h in "${hosts[@]}"; do
    BOOT_RCS[$h]=0; wait "${QEMU_WRAP_PIDS[$h]}" || BOOT_RCS[$h]=$?
    wait "${STAMP_PIDS[$h]}" 2>/dev/null || true
    rm -f "$RUN/serial$(host_sfx "$h").fifo"
    [[ ${BOOT_RCS[$h]} -ne 124 ]] || warn "QEMU${tag:+ of host $h} killed by timeout after ${BOOT_TIMEOUT}s"
    [[ $BOOT_RC -ne 0 ]] || BOOT_RC=${BOOT_RCS[$h]}
  done
  QEMU_WRAP_PIDS=(); STAMP_PIDS=()
  return 0
}

# kill_host HOST: that host's QEMU only (by its pidfile, like kill_qemu).
kill_host() {
  local pidfile=$RUN/qemu$(host_sfx "$1").pid pid
  [[ -s $pidfile ]] || return 0
  pid=$(cat "$pidfile")
  if [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q -- "-pidfile $pidfile "; then
    kill "$pid" 2>/dev/null || true
  fi
}
