# The GPU check's phase selection and time budget (sourced by gpu_check.sh;
# tests/python/test_bench_cuda.py checks them without a GPU). Needs BUDGET
# and START (seconds, bash's $SECONDS at the start) set by the caller.

# The phases to run, in this order: single (single-process GPU tests), lists
# (list-op benchmarks), multi (multi-process GPU tests), ipc (benchmarks
# across processes). GPU_CHECK_PHASES picks some (default: all).
PHASES=${GPU_CHECK_PHASES:-single,lists,multi,ipc}
want() { case ",$PHASES," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# The seconds a phase is given when a later selected phase waits for it to
# end (the last selected phase gets what is left of the budget instead).
need() {
  case $1 in
    lists) echo 150 ;;
    multi) echo 150 ;;
    ipc) echo 110 ;;  # its benchmark's 90 s and 20 s for the report after it
    *) echo 0 ;;
  esac
}

# reserve_after PHASE: the seconds kept for the selected phases after PHASE
# (the sum of their needs; 0 when PHASE is the last selected one).
reserve_after() {
  local sum=0 p seen=0
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
