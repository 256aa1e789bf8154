# shellcheck shell=bash
# Turn the console log into results: checks, guest phase times, metrics.
#
# Marker lines (see lab/guest/lib.sh) arrive as "[  t.tt] <guest>| @@KIND ...".

# parse_console: writes $RUN/results.tsv (guest check status detail),
# $RUN/metrics.tsv (guest name value unit), $RUN/gphases.tsv (name start end).
# With two hosts, both consoles: guest names differ (host b's dom0 is
# "dom0b"; a domU reports under its own name on whichever host it runs), and
# host b's phases are labelled "b:".
parse_console() {
  : > "$RUN/results.tsv"; : > "$RUN/metrics.tsv"; : > "$RUN/gphases.tsv"
  parse_host_console "$RUN/console.log" "" "${BOOT_RCS[a]:-$BOOT_RC}"
  if (( ${HOSTS:-1} > 1 )); then parse_host_console "$RUN/console-b.log" "b" "${BOOT_RCS[b]:-?}"; fi
  local e g c
  for e in "${EXPECT[@]}"; do
    g=${e%%:*}; c=${e#*:}
    awk -F'\t' -v g="$g" -v c="$c" '$1 == g && $2 == c {f=1} END {exit !f}' "$RUN/results.tsv" \
      || printf '%s\t%s\tFAIL\t%s\n' "$g" "$c" "expected result never reported" >> "$RUN/results.tsv"
  done
}

# parse_host_console LOG LABEL QEMU_RC: appends to the three files.
parse_host_console() {
  local log=$1 label=$2 qrc=$3
  [[ -f $log ]] || : > "$log"
  awk -v res="$RUN/results.tsv" -v met="$RUN/metrics.tsv" -v ph="$RUN/gphases.tsv" -v lbl="${label:+$label: }" '
    function ts(line) { return substr(line, 2, index(line, "]") - 2) + 0 }
    {
      line = $0; t = ts(line)
      body = substr(line, index(line, "]") + 2)
      if (xen == "" && body ~ /Xen version/) xen = t
      if (kernel == "" && body ~ /Linux version/) kernel = t
      if (match(body, /^[A-Za-z0-9_-]+\| @@/)) {
        guest = substr(body, 1, index(body, "|") - 1)
        rest = substr(body, index(body, "@@") + 2)
        # Xen writes to the same serial line at any moment: a message of
        # its own ("(XEN) ...") cut into a marker line is not the marker
        sub(/\(XEN\).*$/, "", rest)
        n = split(rest, f, " ")
        kind = f[1]
        if (kind == "RESULT") {
          detail = ""; for (i = 4; i <= n; i++) detail = detail (i > 4 ? " " : "") f[i]
          printf "%s\t%s\t%s\t%s\n", guest, f[2], f[3], detail >> res
        } else if (kind == "METRIC") {
          printf "%s\t%s\t%s\t%s\n", guest, f[2], f[3], f[4] >> met
        } else if (kind == "EXIT") {
          printf "%s\t%s\t%s\t%s\n", guest, "exit", (f[2] == "0" ? "PASS" : "FAIL"), "rc=" f[2] >> res
        } else if (kind == "PHASE") {
          mark[f[2]] = t
        } else if (kind == "READY") {
          if (!(guest in ready)) ready[guest] = t
        } else if (kind == "DONE") {
          done = t
        }
      }
      last = t
    }
    END {
      # guest-side phases: name, from, to (seconds since QEMU start)
      p0 = 0
      if (xen != "")   { printf lbl "xen: qemu start -> xen banner\t%s\t%s\n", p0, xen >> ph; p0 = xen }
      if ("dom0-userspace" in mark) { printf lbl "xen + dom0 kernel boot -> dom0 /init\t%s\t%s\n", p0, mark["dom0-userspace"] >> ph; p0 = mark["dom0-userspace"] }
      if ("toolstack-ready" in mark) { printf lbl "dom0 toolstack + bridge\t%s\t%s\n", p0, mark["toolstack-ready"] >> ph; p0 = mark["toolstack-ready"] }
      if ("domus-created" in mark) { printf lbl "xl create domUs\t%s\t%s\n", p0, mark["domus-created"] >> ph; p0 = mark["domus-created"] }
      if ("domus-ready" in mark) { printf lbl "domUs boot -> @@READY\t%s\t%s\n", p0, mark["domus-ready"] >> ph; p0 = mark["domus-ready"] }
      if ("scenario-done" in mark) { printf lbl "scenario\t%s\t%s\n", p0, mark["scenario-done"] >> ph; p0 = mark["scenario-done"] }
      if ("moves-done" in mark) { printf lbl "domU moves between hosts\t%s\t%s\n", mark["moves-start"], mark["moves-done"] >> ph }
      if (done != "") { printf lbl "teardown -> @@DONE\t%s\t%s\n", p0, done >> ph; p0 = done }
      printf lbl "shutdown -> QEMU exit\t%s\t%s\n", p0, last >> ph
    }' "$log"
  [[ ${LAB_KERNEL:-lab} != debug ]] || scan_console_reports "$log" "$label"
  local check=boot-and-teardown${label:+-$label}
  if grep -aq '@@DONE' "$log"; then
    printf 'host\t%s\tPASS\t%s\n' "$check" "qemu rc=$qrc" >> "$RUN/results.tsv"
  else
    printf 'host\t%s\tFAIL\t%s\n' "$check" "no @@DONE (qemu rc=$qrc)" >> "$RUN/results.tsv"
  fi
}

# scan_console_reports LOG LABEL (debug kernel): a detector's report in any
# guest's kernel messages on the console. Each guest checks its whole log at
# the end (lab/guest/kernel-check.sh); this catches a guest that died or
# hung before it could. Kernel lines are the ones with printk's timestamp.
scan_console_reports() {
  local log=$1 label=$2 re hits
  re=$(sed -n "s/^KERNEL_REPORT_RE='\(.*\)'$/\1/p" "$LAB_DIR/guest/kernel-check.sh")
  [[ -n $re ]] || die "no KERNEL_REPORT_RE in lab/guest/kernel-check.sh"
  hits=$(grep -aE '^\[[^]]*\] ([A-Za-z0-9_-]+\| )?\[ *[0-9]+\.[0-9]+\] ' "$log" | grep -aE "$re" || true)
  local check=kernel-reports-console${label:+-$label}
  if [[ -z $hits ]]; then
    printf 'host\t%s\tPASS\t%s\n' "$check" "no detector report on the console" >> "$RUN/results.tsv"
  else
    printf 'host\t%s\tFAIL\t%s\n' "$check" "$(wc -l <<< "$hits") report lines, first: $(head -n 1 <<< "$hits" | cut -c1-120)" >> "$RUN/results.tsv"
    head -n 20 <<< "$hits" > "$RUN/kernel-reports${label:+-$label}.txt"
  fi
}

print_summary() {
  local pass fail skip
  echo
  echo "${C_B}==== xensock lab: $SCENARIO ====${C_0}   ($RUN)"
  echo
  printf '%-8s %-34s %-6s %s\n' GUEST CHECK RESULT DETAIL
  while IFS=$'\t' read -r g c s d; do
    local col=$C_G; [[ $s == FAIL ]] && col=$C_R; [[ $s == SKIP ]] && col=$C_Y
    printf '%-8s %-34s %s%-6s%s %s\n' "$g" "$c" "$col" "$s" "$C_0" "$d"
  done < <(sort -s -t$'\t' -k1,1 "$RUN/results.tsv")
  if [[ -s $RUN/metrics.tsv ]]; then
    echo
    print_metrics_table
  fi
  echo
  printf '%-44s %9s\n' PHASE SECONDS
  local i
  for i in "${!PHASE_NAMES[@]}"; do
    printf '%-44s %9s  %s\n' "host: ${PHASE_NAMES[$i]}" "${PHASE_SECS[$i]}" "${PHASE_STATUS[$i]}"
  done
  while IFS=$'\t' read -r n a b; do
    printf '%-44s %9s\n' "  guest: $n" "$(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.1f", b-a}')"
  done < "$RUN/gphases.tsv"
  printf '%-44s %9s\n' "total wall time" "$(elapsed | tr -d ' ')"
  [[ -z ${LOAD_START:-} ]] || printf 'host load average (1 min) at boot start/end: %s / %s on %s CPUs (QEMU itself adds ~2; more means other work slowed the guests)\n' \
    "$LOAD_START" "${LOAD_END:-?}" "$(nproc)"
  local h
  for h in "${!QEMU_HWM_KB[@]}"; do
    printf 'QEMU%s peak RSS: %s MiB\n' "$( (( ${HOSTS:-1} > 1 )) && echo " (host $h)")" "$(( QEMU_HWM_KB[$h] / 1024 ))"
  done
  pass=$(awk -F'\t' '$3=="PASS"' "$RUN/results.tsv" | wc -l)
  fail=$(awk -F'\t' '$3!="PASS" && $3!="SKIP"' "$RUN/results.tsv" | wc -l)
  skip=$(awk -F'\t' '$3=="SKIP"' "$RUN/results.tsv" | wc -l)
  echo
  if (( fail == 0 && pass > 0 )); then
    echo "${C_G}${C_B}RESULT: PASS${C_0} ($pass passed, $skip skipped)"; return 0
  fi
  echo "${C_R}${C_B}RESULT: FAIL${C_0} ($pass passed, $fail failed, $skip skipped)"; return 1
}

# Metrics "<row>.<column>" become a table: one row per transport.
print_metrics_table() {
  awk -F'\t' '
    { split($2, p, "."); row = p[1]; col = substr($2, length(row) + 2)
      if (!(row in seen)) { seen[row] = 1; rows[++nr] = row }
      if (!(col in cseen)) { cseen[col] = 1; cols[++nc] = col; unit[col] = $4 }
      v[row, col] = $3 }
    END {
      printf "%-22s", "METRICS"
      for (j = 1; j <= nc; j++) printf " %18s", cols[j] " (" unit[cols[j]] ")"
      printf "\n"
      for (i = 1; i <= nr; i++) {
        printf "%-22s", rows[i]
        for (j = 1; j <= nc; j++) printf " %18s", ((rows[i], cols[j]) in v) ? v[rows[i], cols[j]] : "-"
        printf "\n"
      }
    }' "$RUN/metrics.tsv"
}
