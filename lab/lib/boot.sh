# shellcheck shell=bash
# Boot Xen + dom0 (+ domUs) under QEMU TCG, follow the console, and never
# leave QEMU behind: it runs under `timeout`, its PID is recorded, and the
# EXIT trap kills exactly that process.

QEMU_WRAP_PID=; STAMP_PID=

kill_qemu() {
  local pid
  if [[ -s ${RUN:-/nonexistent}/qemu.pid ]]; then
    pid=$(cat "$RUN/qemu.pid")
    if [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q "$RUN/qemu.pid"; then
      kill "$pid" 2>/dev/null || true
      sleep 1
      kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  if [[ -n $QEMU_WRAP_PID ]] && kill -0 "$QEMU_WRAP_PID" 2>/dev/null; then
    kill "$QEMU_WRAP_PID" 2>/dev/null || true
  fi
}

boot_cleanup() {
  kill_qemu
  if [[ -n $STAMP_PID ]] && kill -0 "$STAMP_PID" 2>/dev/null; then kill "$STAMP_PID" 2>/dev/null || true; fi
  QEMU_WRAP_PID=; STAMP_PID=
}

# Lines worth showing while the machine runs (everything with -v).
progress_filter() {
  if [[ ${VERBOSE:-0} = 1 ]]; then cat; return; fi
  grep -aE '@@(PHASE|READY|RESULT|METRIC|EXIT|DONE)|\(XEN\) Xen version|Kernel panic|BUG:|Oops|Panic on CPU|FATAL|xl create|created \(domid' || true
}

# boot [interactive]: runs the machine; sets BOOT_RC (QEMU's exit status).
boot() {
  local interactive=${1:-}
  local qmem=$(( DOM0_MEM + NDOMUS * DOMU_MEM + 512 ))
  local xencmd="console=com1 com1=115200,8n1 dom0_mem=${DOM0_MEM}M,max:${DOM0_MEM}M dom0_max_vcpus=2 bootscrub=0 console_timestamps=boot loglvl=${XEN_LOGLVL:-warning} guest_loglvl=${XEN_LOGLVL:-warning}"
  local domus; domus=$(seq -s: -f 'domu%g' 1 "$NDOMUS")
  local dom0cmd="console=hvc0 earlyprintk=xen loglevel=${GUEST_LOGLEVEL:-4} rdinit=/init lab_domus=$domus lab_domu_mem=$DOMU_MEM lab_timeout=$GUEST_TIMEOUT${interactive:+ lab_shell=1}"
  local -a qemu=(qemu-system-x86_64 -machine q35 -accel tcg -cpu qemu64,+svm,+npt
    -m "$qmem" -smp 2 -nodefaults -display none -monitor none -serial stdio -no-reboot
    -pidfile "$RUN/qemu.pid"
    -kernel "$XEN_IMAGE" -append "$xencmd"
    -initrd "$KDIR/bzImage $dom0cmd,$RUN/dom0.cpio.gz")
  printf '%q ' "${qemu[@]}" > "$RUN/qemu.cmdline"; echo >> "$RUN/qemu.cmdline"
  rm -f "$RUN/qemu.pid" "$RUN/console.log"
  say "QEMU: TCG, ${qmem} MiB, 2 vCPUs; dom0 ${DOM0_MEM} MiB, $NDOMUS domU x ${DOMU_MEM} MiB; timeout ${BOOT_TIMEOUT}s"
  say "console log: $RUN/console.log"
  LOAD_START=$(cut -d' ' -f1 /proc/loadavg)

  if [[ -n $interactive ]]; then
    BOOT_RC=0
    timeout -k 10 "$BOOT_TIMEOUT" "${qemu[@]}" || BOOT_RC=$?
    return 0
  fi

  mkfifo "$RUN/serial.fifo"
  # every console line stamped with seconds since QEMU start
  perl -MTime::HiRes=time -ne 'BEGIN{$|=1; $t0=time} s/\r//g; printf "[%8.2f] %s", time-$t0, $_' \
    < "$RUN/serial.fifo" > "$RUN/console.log" &
  STAMP_PID=$!
  timeout -k 10 "$BOOT_TIMEOUT" "${qemu[@]}" < /dev/null > "$RUN/serial.fifo" 2>&1 &
  QEMU_WRAP_PID=$!

  local shown=0 total done_at='' alive
  while :; do
    alive=0; kill -0 "$QEMU_WRAP_PID" 2>/dev/null && alive=1
    [[ -f $RUN/console.log ]] || { sleep 1; continue; }
    total=$(wc -l < "$RUN/console.log")
    if (( total > shown )); then
      sed -n "$((shown + 1)),${total}p" "$RUN/console.log" | progress_filter | sed 's/^/  | /'
      shown=$total
    fi
    (( alive )) || break
    if [[ -z $done_at ]] && grep -aq '@@DONE' "$RUN/console.log"; then done_at=$SECONDS; fi
    if [[ -n $done_at ]] && (( SECONDS - done_at > 30 )); then
      warn "machine still up 30 s after @@DONE: killing QEMU"; kill_qemu
    fi
    sleep 1
  done
  LOAD_END=$(cut -d' ' -f1 /proc/loadavg)
  BOOT_RC=0; wait "$QEMU_WRAP_PID" || BOOT_RC=$?
  QEMU_WRAP_PID=
  wait "$STAMP_PID" 2>/dev/null || true
  STAMP_PID=
  rm -f "$RUN/serial.fifo"
  [[ $BOOT_RC -ne 124 ]] || warn "QEMU killed by timeout after ${BOOT_TIMEOUT}s"
  return 0
}
