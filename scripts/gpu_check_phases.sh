# The GPU check's phase selection and time budget (sourced by gpu_check.sh;
# tests/tooling/test_bench_cuda.py checks them without a GPU). Needs BUDGET
# and START (seconds, bash's $SECONDS at the start) set by the caller. The
# budget counts from the script's start: the build, the smoke test and the
# MPS start are inside it.

# The phases to run, in this order: single (single-process GPU tests), lists
# (list-op benchmarks), multi (multi-process GPU tests), ipc (benchmarks
# across processes). GPU_CHECK_PHASES picks some (default: all).
PHASES=${GPU_CHECK_PHASES:-single,lists,multi,ipc}
want() { case ",$PHASES," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# The seconds a phase needs (measured on one H100/H200, with margin): what
# is kept for it while an earlier phase runs, and its share of the minimum
# budget. The last selected phase may take whatever is left.
need() {
  case $1 in
    single) echo 60 ;;   # ~1,700 covering-array cases of test_cuda.py at ~27 ms, the plumbing tests
    lists) echo 50 ;;    # the --quick list sweep and the host times
    multi) echo 140 ;;   # 3 batched launches (2, 3, 4 ranks) and ~11 single-scenario ones
    ipc) echo 110 ;;     # 2, 3 and 4 ranks' dist.all_reduce (100 s), then the report
    *) echo 0 ;;
  esac
}
# Before the phases: the smoke test and starting (or recovering) the MPS daemon.
FIXED_S=30

# build_need: seconds the build may need. A cold build took 62 s with 16
# jobs on an H200 (sm_90 only), before the one-kernel files grew to up to
# 160 kernel instances each (nvcc's --split-compile now spreads each file
# over the cores); twice that. An extension newer than every source and
# setup.py is rebuilt in seconds. GPU_CHECK_BUILD_S overrides.
build_need() {
  if [ -n "${GPU_CHECK_BUILD_S:-}" ]; then echo "$GPU_CHECK_BUILD_S"; return; fi
  local so
  so=$(ls fastpar/_C*.so 2>/dev/null | head -1)
  if [ -n "$so" ] && [ -z "$(find csrc setup.py scripts/toolchain_guard.py -newer "$so" -type f 2>/dev/null | head -1)" ]
  then
    echo 30
  else
    echo 120
  fi
}

# min_budget: the build's need, FIXED_S and every selected phase's need.
min_budget() {
  local sum p
  sum=$(( $(build_need) + FIXED_S ))
  for p in single lists multi ipc; do
    want "$p" && sum=$((sum + $(need "$p")))
  done
  echo "$sum"
}

# check_budget: refuses (exit status 1, one line naming the minimum and its
# parts) a budget under min_budget: the build would be starved, as a 170 s
# budget once gave it 10 s.
check_budget() {
  local min parts p
  min=$(min_budget)
  [ "$BUDGET" -ge "$min" ] && return 0
  parts="build $(build_need) s, smoke test and MPS $FIXED_S s"
  for p in single lists multi ipc; do
    want "$p" && parts="$parts, $p $(need "$p") s"
  done
  echo "gpu_check: the budget of $BUDGET s is below the minimum of $min s for the selected phases ($parts);" \
       "raise it (--budget SECONDS or GPU_CHECK_BUDGET_S), or select fewer phases with GPU_CHECK_PHASES"
  return 1
}

# reserve_after PHASE: the seconds kept for the selected phases after PHASE
# (the sum of their needs; 0 when PHASE is the last selected one). "build"
# keeps FIXED_S and every selected phase's need.
reserve_after() {
  local sum=0 p seen=0
  [ "$1" = build ] && sum=$FIXED_S && seen=1
  for p in single lists multi ipc; do
    [ "$seen" = 1 ] && want "$p" && sum=$((sum + $(need "$p")))
    [ "$p" = "$1" ] && seen=1
  done
  echo "$sum"
}

# phase_cap PHASE: its need while a later selected phase waits, else the
# whole budget (phase_limit then cuts it to what is left).
phase_cap() {
  if [ "$(reserve_after "$1")" -gt 0 ]; then need "$1"; else echo "$BUDGET"; fi
}

left() { echo $((BUDGET - (SECONDS - START))); }
# phase_limit CAP RESERVE: seconds a phase may take: CAP, or what is left of
# the budget minus RESERVE (kept for the phases after it), at least 10.
phase_limit() {
  local cap=$1 reserve=${2:-0} rest
  rest=$(( $(left) - reserve ))
  [ "$rest" -lt "$cap" ] && cap=$rest
  [ "$cap" -lt 10 ] && cap=10
  echo "$cap"
}

# build_limit: the build gets what the budget leaves after the smoke test
# and the selected phases' needs: at least its need, since check_budget
# refused any budget that would leave less.
build_limit() {
  local rest
  rest=$(( $(left) - $(reserve_after build) ))
  [ "$rest" -lt "$(build_need)" ] && rest=$(build_need)
  echo "$rest"
}
