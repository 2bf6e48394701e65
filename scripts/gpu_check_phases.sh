# The GPU check's phase selection and time budget (sourced by gpu_check.sh;
# tests/python/test_bench_cuda.py checks them without a GPU). Needs BUDGET
# and START (seconds, bash's $SECONDS at the start) set by the caller.

# The phases to run, in this order: single (single-process GPU tests), lists
# (list-op benchmarks), multi (multi-process GPU tests), ipc (benchmarks
# across processes). GPU_CHECK_PHASES picks some (default: all).
PHASES=${GPU_CHECK_PHASES:-single,lists,multi,ipc}
want() { case ",$PHASES," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# reserve_after PHASE SECONDS: SECONDS when a later phase is selected, else 0
# (the last selected phase may use what is left of the budget).
reserve_after() {
  local later=0 p seen=0
  for p in single lists multi ipc; do
    [ "$seen" = 1 ] && want "$p" && later=1
    [ "$p" = "$1" ] && seen=1
  done
  if [ "$later" = 1 ]; then echo "$2"; else echo 0; fi
}

# phase_cap PHASE DEFAULT: DEFAULT when a later phase is selected, else the
# whole budget (the last selected phase may use what is left).
phase_cap() {
  if [ "$(reserve_after "$1" 1)" = 1 ]; then echo "$2"; else echo "$BUDGET"; fi
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
