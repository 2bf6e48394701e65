#!/usr/bin/env bash
# Sets up a fresh machine: a virtual environment in .venv with torch, the test
# and plotting tools, and fastpar built from this checkout (CUDA kernels
# compiled whenever nvcc and a CUDA build of torch are present, GPU or not).
#   FASTPAR_TORCH=torch==2.13.0 bash scripts/setup.sh   # the CPU-only torch instead
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${FASTPAR_TORCH:-torch==2.14.1}

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# pip_install ARGS...: pip's own exit status, its output less one known warning.
pip_install() {
  local rc=0
  .venv/bin/pip install -q "$@" > .venv/pip.log 2>&1 || rc=$?
  grep -v "^WARNING: Location" .venv/pip.log >&2 || true  # grep fails when it filtered every line
  return $rc
}
pip_install setuptools wheel ninja
pip_install "$TORCH_SPEC" numpy pytest pytest-timeout
.venv/bin/python -c "import torch"
# matplotlib: the benchmark plots; lightning, accelerate: the client programs
# tests/clients runs on fastpar. Without them those tests skip, so under
# CI=true (.ci/run) a failed install fails the set-up.
OPTIONAL=(matplotlib lightning==2.6.6 accelerate==1.15.0)
if ! pip_install "${OPTIONAL[@]}"; then
  if [ "${CI:-}" = true ] || [ "${CI:-}" = 1 ]; then
    echo "setup: could not install ${OPTIONAL[*]} (CI=true: the tests that need them must run)" >&2
    exit 1
  fi
  echo "setup: WARNING: could not install ${OPTIONAL[*]}: tests/clients and the plots will be skipped" >&2
fi
# --no-build-isolation: compile against the torch installed above (its C++ ABI must match).
# -e: the checkout is the package (fastpar/_C*.so is built in place), so the
# examples, benchmarks/main_job.py and the tests all import the same build.
if ! MAX_JOBS=${MAX_JOBS:-2} .venv/bin/pip install -v --no-build-isolation -e . > .venv/fastpar-build.log 2>&1; then
  grep -v "^WARNING: Location" .venv/fastpar-build.log | tail -60
  echo "fastpar build failed; full log: .venv/fastpar-build.log" >&2
  exit 1
fi
grep -ho "fastpar: building.*" .venv/fastpar-build.log | head -1 || true
grep -ho "fastpar: toolchain check passed.*" .venv/fastpar-build.log | head -1 || true
# the extension's size, into the build log too (README quotes none: it varies with the CUDA archs)
for so in fastpar/_C*.so; do
  echo "fastpar: extension $so: $(du -k "$so" | cut -f1) KiB" | tee -a .venv/fastpar-build.log
done
# The build guard (setup.py) checked the toolchain and the linked library; this
# runs the extension: its error-message path is where a C++ runtime that does
# not match torch's first shows (a truncated message or a segfault).
.venv/bin/python scripts/smoke_test.py
.venv/bin/python -c "import fastpar; print('fastpar ready:', fastpar.build_info())"
