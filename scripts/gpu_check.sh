#!/usr/bin/env bash
# The GPU check: on whatever NVIDIA GPUs this machine has, build fastpar in
# place for them, run the build smoke test, every GPU test (single-process,
# then multi-process with an MPS daemon so ranks sharing a GPU run at once)
# and the GPU benchmarks; print one summary. Within a time budget (--budget,
# default 540 s, counted from the start: build included; the whole check fits
# it on one H100/H200). A budget below what the selected phases need
# (gpu_check_phases.sh: min_budget) is refused at once, naming the minimum.
# docs/gpu.md is the user's page: phases, budgets, MPS, recovery after a crash.
#
#   bash scripts/gpu_check.sh                 # results in benchmarks/results/gpu/
#   bash scripts/gpu_check.sh --out DIR --budget SECONDS
#       # results in DIR (written as each phase ends, so a run cut off keeps them);
#       # the budget (also GPU_CHECK_BUDGET_S)
#   PYTHON=python3 bash scripts/gpu_check.sh  # the interpreter with torch (default: .venv's, else python3)
#   GPU_CHECK_PHASES=multi GPU_CHECK_TESTS='graph or p2p_first' bash scripts/gpu_check.sh
#       # build + smoke test, then only the named phases (single, lists, multi, ipc; default all),
#       # only the tests a pytest -k expression picks; a phase left alone gets the whole budget
#   GPU_CHECK_SINGLE_S / GPU_CHECK_MULTI_S    # caps for the test phases, which otherwise take what is
#       # left of the budget less the needs of the later selected phases (gpu_check_phases.sh)
#   GPU_CHECK_BUILD_S                         # the build's need (default 120 s cold, 30 s when up to date)
#
# Logs, CSV, PNG and summary.txt (with what the run decided) go to the results folder. The exit code is
# nonzero when the build, the smoke test or a test failed (2: bad arguments or
# a budget refused); missed benchmark targets are reported, not failures.
set -uo pipefail
START=$SECONDS
BUDGET=${GPU_CHECK_BUDGET_S:-540}
RESULTS=""
while [ $# -gt 0 ]; do
  case $1 in
    --out) RESULTS=${2:?--out needs a folder}; shift 2 ;;
    --out=*) RESULTS=${1#--out=}; shift ;;
    --budget) BUDGET=${2:?--budget needs seconds}; shift 2 ;;
    --budget=*) BUDGET=${1#--budget=}; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (options: --out DIR, --budget SECONDS; --help)"; exit 2 ;;
  esac
done
case $BUDGET in
  ''|*[!0-9]*) echo "gpu_check: the budget must be whole seconds, not '$BUDGET'"; exit 2 ;;
esac
# a relative --out is relative to where the script was started
[ -n "$RESULTS" ] && case $RESULTS in /*) ;; *) RESULTS=$PWD/$RESULTS ;; esac
cd "$(dirname "$0")/.." || exit 1
RESULTS=${RESULTS:-$PWD/benchmarks/results/gpu}
mkdir -p "$RESULTS" || exit 2
LOG=$RESULTS/gpu_check.log
: > "$LOG"
exec > >(tee -a "$LOG") 2>&1
TEE_PID=$!

if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# The fused kernels are not the default until they have run here: the GPU
# tests run them (the steps forms ran before).
export FASTPAR_CUDA_IPC_TWO_SHOT=${FASTPAR_CUDA_IPC_TWO_SHOT:-fused}
export FASTPAR_CUDA_IPC_COLLECTIVES=${FASTPAR_CUDA_IPC_COLLECTIVES:-fused}
# Every kernel of the process loaded when its CUDA context starts, not at its
# first launch: loading a module waits for the context's running kernels, and
# a spinning IPC kernel of this process waits for its peers, so a torch or
# NCCL kernel loaded lazily behind it could wait out the timeout (docs/cuda.md).
export CUDA_MODULE_LOADING=EAGER
FAILED=()
STARTED_MPS=0
# shellcheck source=gpu_check_phases.sh
source scripts/gpu_check_phases.sh
K_ARGS=()
[ -n "${GPU_CHECK_TESTS:-}" ] && K_ARGS=(-k "$GPU_CHECK_TESTS")
# Up front: a budget that would starve the build (or a phase) is refused
# before anything runs, naming the minimum.
check_budget || exit 2

# The MPS daemon's logs, next to the results; after every phase, not only at
# exit: a run killed with SIGKILL (which runs no trap) keeps the ones so far.
copy_out() {
  local f
  for f in /tmp/fastpar-mps-log/*.log; do
    [ -f "$f" ] && cp "$f" "$RESULTS/mps-$(basename "$f")"
  done
  return 0
}
stop_mps() {
  if [ "$STARTED_MPS" = 1 ]; then
    echo quit | nvidia-cuda-mps-control && echo "MPS daemon stopped"
    STARTED_MPS=0
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  fi
}
# A CUDA client can start: set the device, allocate, synchronize (30 s at most).
cuda_client_ok() {
  timeout 30 "$PY" -c 'import torch; torch.cuda.set_device(0); torch.zeros(1, device="cuda"); torch.cuda.synchronize()' \
    > /dev/null 2>&1
}
# After ranks were SIGKILLed with kernels spinning, the MPS server refuses
# new clients while it cleans up after them (torch.cuda.set_device:
# cudaErrorDevicesUnavailable, "busy or unavailable"), for a few seconds.
# wait_for_gpu LABEL: retries for up to 45 s; then, if the daemon is ours,
# restarts it once. Nonzero when no client could start.
wait_for_gpu() {
  local label=$1 t0=$SECONDS
  while ! cuda_client_ok; do
    if [ $((SECONDS - t0)) -ge 45 ]; then
      if [ "$STARTED_MPS" = 1 ]; then
        echo "== $label: no CUDA client could start for $((SECONDS - t0)) s; restarting our MPS daemon"
        echo quit | nvidia-cuda-mps-control
        sleep 2
        nvidia-cuda-mps-control -d && cuda_client_ok && return 0
      fi
      echo "== $label: no CUDA client could start for $((SECONDS - t0)) s (docs/gpu.md: after a crash)"
      return 1
    fi
    sleep 3
  done
  [ $((SECONDS - t0)) -gt 0 ] && echo "== $label: the GPU takes clients again after $((SECONDS - t0)) s"
  return 0
}
finish() {
  stop_mps
  # tee writes the log asynchronously: let it take the last lines before the
  # copy, for at most 5 s (a daemon that inherited the pipe keeps tee alive)
  exec >&- 2>&-
  local i
  for i in $(seq 50); do
    kill -0 "$TEE_PID" 2>/dev/null || break
    sleep 0.1
  done
  copy_out
}
trap finish EXIT
trap 'echo "gpu_check: interrupted"; exit 130' INT TERM

echo "== fastpar GPU check, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU here (nvidia-smi finds none)"; exit 1
fi
nvidia-smi --query-gpu=index,name,driver_version,compute_cap,memory.total --format=csv
"$PY" - <<'EOF'
import platform, torch
print(f"python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"NCCL {'.'.join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else '-'}, "
      f"{torch.cuda.device_count()} GPU(s) visible to torch")
EOF
nvcc --version 2>/dev/null | tail -1
# A driver too old for this torch's CUDA: nvidia-smi sees the GPU, torch does
# not, every GPU test would skip and the check would pass having run nothing.
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.device_count() > 0 else 1)'; then
  echo "gpu_check: torch sees no GPU (torch.cuda.device_count() == 0) although nvidia-smi does"; exit 1
fi

# --- build: the GPUs' own architectures and the system compiler, whatever
# $CXX says (the H100 machine's default /opt/gcc/bin/g++ links libstdc++
# statically: setup.py's guard would refuse it). GPU_CHECK_CXX/GPU_CHECK_CC override.
ARCHS=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | sort -u | paste -sd';' -)
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$ARCHS}
if [ -n "${GPU_CHECK_CXX:-}" ]; then export CXX=$GPU_CHECK_CXX
elif [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++
fi
if [ -n "${GPU_CHECK_CC:-}" ]; then export CC=$GPU_CHECK_CC
elif [ -x /usr/bin/gcc ]; then export CC=/usr/bin/gcc
fi
BUILD_LIMIT=$(build_limit)
echo "== build (at most $BUILD_LIMIT s): TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST CXX=${CXX:-} CC=${CC:-} MAX_JOBS=$(nproc)"
t0=$SECONDS
if ! FASTPAR_CUDA=1 MAX_JOBS=$(nproc) timeout "$BUILD_LIMIT" "$PY" setup.py build_ext --inplace \
    > "$RESULTS/build.log" 2>&1; then
  tail -40 "$RESULTS/build.log"
  echo "gpu_check: build FAILED ($((SECONDS - t0)) s); log: $RESULTS/build.log"
  exit 1
fi
grep -h "^fastpar: " "$RESULTS/build.log"
echo "built in $((SECONDS - t0)) s: $(ls -sh fastpar/_C*.so)"

echo "== smoke test (the extension's error-message path)"
timeout 120 "$PY" scripts/smoke_test.py || { echo "gpu_check: smoke test FAILED"; exit 1; }
copy_out

# --- tests. GPU test files, in every feature folder (tests/*/): those that
# look at GPUs or take the device shapes of tests/common/batched_scenarios.py;
# multi-process ones start ranks (multiprocessing, the dist harness, the
# batched scenarios). A multi-process file also holds CPU shapes: that phase
# runs only the tests marked `cuda` (pytest -m cuda).
mapfile -t GPU_TESTS < <(grep -l -E 'torch\.cuda\.device_count|built_with_cuda|cuda_built\(|from batched_scenarios import' \
  tests/*/test_*.py)
MULTI=()
if [ "${#GPU_TESTS[@]}" -gt 0 ]; then
  mapfile -t MULTI < <(grep -l -E 'multiprocessing|dist_harness|from batched_scenarios import|run_cuda' "${GPU_TESTS[@]}")
fi
SINGLE=() LAST=()
for f in "${GPU_TESTS[@]}"; do
  case " ${MULTI[*]} " in
    *" $f "*) ;;
    # test_build.py runs in CI too (it builds, and needs no GPU): last, so a
    # phase cut off by its limit loses it rather than never-run GPU tests
    *test_build.py*) LAST+=("$f") ;;
    *) SINGLE+=("$f") ;;
  esac
done
SINGLE+=("${LAST[@]}")
: > "$RESULTS/tests.log"
run_tests() {  # run_tests LABEL CAP RESERVE VERBOSITY FILES...
  local label=$1 cap=$2 reserve=$3 verbosity=$4 t0=$SECONDS rc first
  shift 4
  first=$(($(wc -l < "$RESULTS/tests.log") + 1))
  echo "== $label tests: $* ${K_ARGS[*]}"
  echo "== $label tests: $* ${K_ARGS[*]}" >> "$RESULTS/tests.log"
  timeout "$(phase_limit "$cap" "$reserve")" "$PY" -m pytest "$verbosity" -p no:cacheprovider -rfE "${K_ARGS[@]}" \
    "$@" >> "$RESULTS/tests.log" 2>&1
  rc=$?
  tail -n "+$first" "$RESULTS/tests.log" | grep -E "^(FAILED|ERROR) |[0-9]+ (passed|failed|skipped|error)" | tail -15
  if [ "$rc" -ne 0 ]; then
    FAILED+=("$label tests (exit $rc$([ "$rc" = 124 ] && echo ', timed out'))")
  fi
  echo "$label tests: exit $rc in $((SECONDS - t0)) s"
  copy_out
}
if [ "${#SINGLE[@]}" -gt 0 ] && want single; then
  run_tests single-process "${GPU_CHECK_SINGLE_S:-$BUDGET}" "$(reserve_after single)" -v "${SINGLE[@]}"
fi

# --- single-process benchmarks (no MPS: one process owns the GPU)
ROWS_LISTS=$RESULTS/rows_lists.json ROWS_IPC=$RESULTS/rows_ipc.json
rm -f "$ROWS_LISTS" "$ROWS_IPC"
: > "$RESULTS/bench.log"
if want lists; then
  LIMIT=$(phase_limit "$(phase_cap lists)" "$(reserve_after lists)")
  echo "== benchmarks: list ops and host time (at most $LIMIT s)"
  # the sweep stops starting new sizes 15 s before the limit, so its rows are kept
  timeout "$LIMIT" "$PY" benchmarks/bench_cuda.py --part host,lists --quick --time-limit $((LIMIT > 30 ? LIMIT - 15 : LIMIT / 2)) \
    --rows-out "$ROWS_LISTS" --out "$RESULTS" >> "$RESULTS/bench.log" 2>&1 \
    || echo "benchmark lists/host: exit $? (log $RESULTS/bench.log)"
  copy_out
fi

# Ranks that share a GPU run their kernels at once only under MPS; without it
# the GPU time-slices between processes and each call takes milliseconds.
if ! want multi && ! want ipc; then
  :  # no multi-process phase selected
elif [ -S /tmp/fastpar-mps-pipe/control ] && pgrep -f 'nvidia-cuda-mps-control' > /dev/null; then
  # Ours, left by an earlier call on this machine that was killed: its
  # clients must find its pipes, and it is stopped at the end this time.
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/fastpar-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/fastpar-mps-log
  STARTED_MPS=1
  echo "== MPS: the daemon an earlier check started still runs; using it (pipes in $CUDA_MPS_PIPE_DIRECTORY)"
elif pgrep -f 'nvidia-cuda-mps-(control|server)' > /dev/null; then
  echo "== MPS: a daemon already runs; using it"
elif command -v nvidia-cuda-mps-control > /dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/fastpar-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/fastpar-mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then
    STARTED_MPS=1
    # The daemon starts even where its server cannot serve clients (some
    # containers): then every process sharing the GPU would fail. Check one.
    if wait_for_gpu "MPS start"; then
      echo "== MPS: daemon started (pipes in $CUDA_MPS_PIPE_DIRECTORY)"
    else
      echo "== MPS: started but a CUDA client failed under it; stopped (ranks sharing a GPU will time-slice)"
      stop_mps
    fi
  else
    echo "== MPS: could not start a daemon; ranks sharing a GPU will time-slice"
  fi
else
  echo "== MPS: nvidia-cuda-mps-control not found; ranks sharing a GPU will time-slice"
fi
# Correctness before speed: 10^4 mixed calls over IPC (odd sizes and
# offsets, both forms of every one-kernel collective, drawn at random), bit for
# bit, in a group whose timeout is 10 s (bench_cuda.py --part check). Wrong
# bits or a failed call fail the check.
if want multi || want ipc; then
  wait_for_gpu "before the correctness check"
  LIMIT=$(phase_limit 150 "$(reserve_after multi)")
  echo "== correctness: 10000 mixed calls, 2 ranks (at most $LIMIT s)"
  if timeout "$LIMIT" "$PY" benchmarks/bench_cuda.py --part check --check-calls 10000 --ipc-timeout $((LIMIT - 5)) \
      --rows-out "$RESULTS/rows_check.json" --out "$RESULTS/check" > "$RESULTS/check.log" 2>&1 \
      && ! grep -q '^error: ' "$RESULTS/check.log"; then
    echo "correctness: no wrong result"
  else
    grep '^error: ' "$RESULTS/check.log" | head -10
    echo "correctness: FAILED (log $RESULTS/check.log)"
    FAILED+=("correctness check")
  fi
fi
if [ "${#MULTI[@]}" -gt 0 ] && want multi; then
  wait_for_gpu "before the multi-process tests"
  # -v: one line per test, so a run cut off by its cap still shows what passed
  run_tests multi-process "${GPU_CHECK_MULTI_S:-$BUDGET}" "$(reserve_after multi)" -v -m cuda "${MULTI[@]}"
fi
if want ipc; then
  # the multi-process tests SIGKILL ranks: the MPS server may still be cleaning up
  wait_for_gpu "before the benchmarks across processes"
  LIMIT=$(phase_limit "$(phase_cap ipc)" 10)
  # With 2 ranks it also times what the first GPU run must decide: a busy rank beside the fused and
  # the steps two-shot, 2 against 8 MiB slots, and the block barriers' flags polled in the peer's
  # memory against flags written into the waiter's (bench_cuda.py's rows (a)-(c); the summary's
  # "decided" lines name the winners).
  echo "== benchmarks: dist.all_reduce across processes (at most $LIMIT s)"
  timeout "$LIMIT" "$PY" benchmarks/bench_cuda.py --part ipc --ipc-timeout $((LIMIT > 20 ? LIMIT - 10 : LIMIT / 2)) \
    --rows-out "$ROWS_IPC" --out "$RESULTS" >> "$RESULTS/bench.log" 2>&1 \
    || echo "benchmark ipc: exit $? (log $RESULTS/bench.log)"
  copy_out
fi
stop_mps

echo "== results"
ROWS=""
for f in "$ROWS_LISTS" "$ROWS_IPC"; do
  [ -s "$f" ] && ROWS=${ROWS:+$ROWS,}$f
done
if [ -n "$ROWS" ]; then
  timeout "$(phase_limit 60 0)" "$PY" benchmarks/bench_cuda.py --report-only --rows-in "$ROWS" --out "$RESULTS"
else
  echo "no benchmark rows; see $RESULTS/bench.log"; tail -20 "$RESULTS/bench.log"
fi
rm -f "$ROWS_LISTS" "$ROWS_IPC"

echo "== gpu_check: $((SECONDS - START)) s"
if [ "${#FAILED[@]}" -gt 0 ]; then
  printf 'FAILED: %s\n' "${FAILED[@]}"
  exit 1
fi
echo "gpu_check: build, smoke test and tests passed"
