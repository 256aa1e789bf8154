# shellcheck shell=bash
# Host side of the migration scenarios, sourced by their scenario.conf after
# it set MIG_STACK (kmod | userspace | mixed: af_xen.ko in MIG_MIXED_KMOD,
# domu1 by default, the user-space transport in the other) and MIG_MOVES (any of: saverestore
# away migrate churn bothsave; churn is MIG_CHURN away/back cycles, default
# 100, under one set of streams; bothsave saves and restores both domUs,
# with the user-space stack's hook in both; MIG_RATE sets the streams'
# KiB/s). The guest scripts are this directory's (SCENARIO_INCLUDE).
SCENARIO_INCLUDE=migration
# xenstored's request trace, for dom0.sh's reports on a move that failed
# (xs_start_failures, move_failed_report); off elsewhere (lab/lib/boot.sh)
XS_TRACE=1
BOOT_TIMEOUT=${BOOT_TIMEOUT_MIG:-2400}
GUEST_TIMEOUT=2200
DOMU_MEM=192
[[ $MIG_STACK != kmod ]] && DOMU_MEM=256
# guest_stack GUEST: the stack GUEST runs
guest_stack() {
  if [[ $MIG_STACK != mixed ]]; then echo "$MIG_STACK"
  elif [[ $1 == "${MIG_MIXED_KMOD:-domu1}" ]]; then echo kmod; else echo userspace; fi
}
# a live migration needs the shadow-paging hypervisor; the *-moves
# scenarios include it only when it is there
if [[ " $MIG_MOVES " == *" migrate "* ]] && [[ ${MIG_MIGRATE_IF_SHADOW:-0} == 1 ]] \
   && [[ ${XEN_OVERRIDE:-$XEN_FLAVOUR} != shadow ]]; then
  MIG_MOVES=${MIG_MOVES/migrate/}
  MIG_MOVES=$(echo $MIG_MOVES)
fi

# MIG_STREAMS (the scenario's): which of them run, instead of all
mig_streams() {
  if [[ -n ${MIG_STREAMS:-} ]]; then echo "$MIG_STREAMS"
  elif [[ $MIG_STACK == kmod ]]; then echo "kx kt tcp pre"
  elif [[ $MIG_STACK == mixed ]]; then echo "mt tcp"; else echo "ut tcp"; fi
}
mig_prefix() { case $1 in kt|ut|mt) echo tokio ;; *) echo c ;; esac; }
EXPECT=(dom0:agent-running dom0:agent-tables dom0:agent-link-dirs
        domu1:advertise domu2:advertise dom0:exit domu1:exit domu2:exit)
for _g in domu1 domu2; do
  [[ $(guest_stack $_g) == kmod ]] && EXPECT+=($_g:kmod-insmod $_g:kmod-dmesg-clean)
done
[[ $MIG_STACK == kmod ]] && EXPECT+=(domu1:preload-dual-listener)
for _m in $MIG_MOVES; do
  case $_m in
    saverestore) EXPECT+=(dom0:xl-save dom0:xl-restore) ;;
    migrate) EXPECT+=(dom0:xl-migrate) ;;
    bothsave) EXPECT+=(dom0:xl-save-both dom0:xl-restore-both dom0:bothsave-new-domid2) ;;
    away) EXPECT+=(dom0:agent-away dom0:away-tables dom0:away-link-dirs-gone dom0:away-moved-noted
                   dom0:agent-back dom0:back-tables dom0:back-link-dirs) ;;
    churn) EXPECT+=(dom0:churn-cycles) ;;
  esac
  _stays=0; [[ $_m == away || $_m == churn ]] && _stays=1
  [[ $_stays == 0 ]] && EXPECT+=(dom0:$_m-new-domid dom0:$_m-tables-again dom0:$_m-link-dirs-again)
  [[ $_stays == 0 && $(guest_stack domu1) == userspace && ${MIG_HOOK:-1} == 1 ]] && EXPECT+=(domu1:$_m-suspend-releases)
  [[ $_m == bothsave && $(guest_stack domu2) == userspace && ${MIG_HOOK:-1} == 1 ]] && EXPECT+=(domu2:$_m-suspend-releases)
  # the one listener domu1 made before the first move (common.sh)
  [[ $MIG_STACK == kmod ]] && EXPECT+=(domu2:resolve-$_m domu2:listener-survives-$_m
    domu2:preload-$_m domu2:preload-dual-$_m domu2:preload-dual-tcp-$_m)
  for _g in domu1 domu2; do
    [[ $(guest_stack $_g) == kmod && $_stays == 0 ]] && EXPECT+=($_g:$_m-proc-own-domid)
  done
  for _s in $(mig_streams); do
    for _g in domu1 domu2; do
      EXPECT+=("$_g:$(mig_prefix "$_s")-$_s-$_m-connect" "$_g:$(mig_prefix "$_s")-$_s-$_m" "$_g:$_s-$_m-flows-before")
      if [[ $_m == away ]]; then
        EXPECT+=("$_g:$_s-away-flows-while-away" "$_g:$_s-away-flows-after-back")
        [[ $_s != tcp ]] && EXPECT+=("$_g:$_s-away-carrier-tcp" "$_g:$_s-away-carrier-ring" "$_g:$_s-away-switches")
      elif [[ $_m == churn ]]; then
        EXPECT+=("$_g:$_s-churn-flows-after")
        [[ $_s != tcp ]] && EXPECT+=("$_g:$_s-churn-every-cycle" "$_g:$_s-churn-switches")
      else
        # saverestore, migrate, bothsave: back on a ring after the move
        EXPECT+=("$_g:$_s-$_m-flows-after")
        [[ $_s != tcp ]] && EXPECT+=("$_g:$_s-$_m-carrier-ring" "$_g:$_s-$_m-switches" "$_g:$_s-$_m-flows-on-ring")
      fi
    done
  done
done
DESCRIPTION="migration in the lab ($MIG_STACK$([[ $MIG_STACK == mixed ]] && echo ": domu1 $(guest_stack domu1), domu2 $(guest_stack domu2)")): checksummed bidirectional streams domu2 <-> domu1 ($(mig_streams)) through: $MIG_MOVES"

# Host side: af_xen.ko (kmod), the static C stream program, static
# (crt-static glibc) builds of lab_stream (tokio-xensock), xensock-agent
# and xensock-discover; and the parameters the guests read.
# CARGO_TARGET_DIR (if set) holds the static build under lab-static/.
scenario_build() {
  local out=$1 t=x86_64-unknown-linux-gnu
  local tdir=${CARGO_TARGET_DIR:-$REPO_DIR/target}/lab-static
  mkdir -p "$out/bin"
  printf 'MIG_STACK=%s\nMIG_MOVES="%s"\nMIG_HOOK=%s\nMIG_CHURN=%s\nMIG_MIXED_KMOD=%s\n' "$MIG_STACK" "$MIG_MOVES" "${MIG_HOOK:-1}" "${MIG_CHURN:-100}" "${MIG_MIXED_KMOD:-domu1}" > "$out/migration.params"
  # a stream rate of the scenario's own (the guests' default: streams.sh)
  [[ -n ${MIG_RATE:-} ]] && echo "RATE=$MIG_RATE" >> "$out/migration.params"
  [[ -n ${MIG_STREAMS:-} ]] && echo "MIG_STREAMS=\"$MIG_STREAMS\"" >> "$out/migration.params"
  [[ -n ${MIG_SAMPLE:-} ]] && echo "MIG_SAMPLE=$MIG_SAMPLE" >> "$out/migration.params"
  # MIG_XS_ET=1: the C streams (AF_XEN and the TCP baseline) on
  # edge-triggered epoll, as tokio's (xsstream's XSSTREAM_ET)
  [[ -n ${MIG_XS_ET:-} ]] && echo "MIG_XS_ET=$MIG_XS_ET" >> "$out/migration.params"
  # MIG_TOKIO_THREADS=1: lab_stream on a current-thread runtime
  [[ -n ${MIG_TOKIO_THREADS:-} ]] && echo "MIG_TOKIO_THREADS=$MIG_TOKIO_THREADS" >> "$out/migration.params"
  # MIG_PROBE=1: lab_stream polls its socket once a second while its reader
  # gets nothing (LAB_STREAM_PROBE)
  [[ -n ${MIG_PROBE:-} ]] && echo "MIG_PROBE=$MIG_PROBE" >> "$out/migration.params"
  # AFX_TREE=DIR (holding af-xen-kmod/ and proto/, e.g. from `git archive
  # <branch> af-xen-kmod proto | tar -x -C DIR`) tests that module instead;
  # RUST_TREE=DIR (a whole workspace, e.g. `git archive <branch> | tar -x
  # -C DIR`) builds the Rust binaries from it (lab_stream.rs is copied in)
  local src=${AFX_TREE:-$REPO_DIR} rsrc=${RUST_TREE:-$REPO_DIR}
  if [[ $MIG_STACK == kmod ]]; then
    afx_module "$out" || return 1
    # TCP programs redirected by the preload library (common.sh, preload_check)
    lab_socat "$out" && lab_preload "$out" || return 1
  elif [[ $MIG_STACK == mixed ]]; then
    afx_module "$out" || return 1
  fi
  gcc -O2 -Wall -static -I "$src/af-xen-kmod/include" -o "$out/bin/xsstream" "$REPO_DIR/tests/lab/c/xsstream.c"
  # the same program dynamically linked, for the preload library (pre streams)
  gcc -O2 -Wall -I "$src/af-xen-kmod/include" -o "$out/bin/xsstream-dyn" "$REPO_DIR/tests/lab/c/xsstream.c"
  gcc -O2 -Wall -static -o "$out/bin/runas" "$REPO_DIR/tests/lab/c/runas.c"
  # the agent and xensock-discover always from this tree (away/back,
  # advertise --keep); lab_stream from RUST_TREE if given
  local rtdir=$tdir lsbuild=(-p xensock-lab-harness --bin lab_stream) lsout=lab_stream
  if [[ $rsrc != "$REPO_DIR" ]]; then
    # another tree need not have the harness crate: the program goes in as
    # tokio-xensock's example there (same dependencies)
    mkdir -p "$rsrc/tokio-xensock/examples"
    cp "$REPO_DIR/lab/harness/src/bin/lab_stream.rs" "$rsrc/tokio-xensock/examples/"
    rtdir=$tdir-alt lsbuild=(-p tokio-xensock --example lab_stream) lsout=examples/lab_stream
  fi
  ( cd "$REPO_DIR" &&
    RUSTFLAGS='-C target-feature=+crt-static' CARGO_TARGET_DIR=$tdir \
      cargo build --release --target $t -p xensock-discovery --bins ) || return 1
  ( cd "$rsrc" &&
    RUSTFLAGS='-C target-feature=+crt-static' CARGO_TARGET_DIR=$rtdir \
      cargo build --release --target $t "${lsbuild[@]}" ) || return 1
  for b in xensock-discover xensock-agent; do cp "$tdir/$t/release/$b" "$out/bin/"; done
  # the user-space transport's migration hook (xensock suspend|resume)
  if [[ $MIG_STACK != kmod ]]; then
    ( cd "$rsrc" &&
      RUSTFLAGS='-C target-feature=+crt-static' CARGO_TARGET_DIR=$rtdir \
        cargo build --release --target $t -p libxensock --features cli --bin xensock ) || return 1
    cp "$rtdir/$t/release/xensock" "$out/bin/"
  fi
  cp "$rtdir/$t/release/$lsout" "$out/bin/"
  strip "$out"/bin/*
  file "$out"/bin/*
}
