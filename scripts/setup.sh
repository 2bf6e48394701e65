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
.venv/bin/pip install -q --upgrade pip setuptools wheel ninja
.venv/bin/pip install -q "$TORCH_SPEC" numpy pytest matplotlib
# --no-build-isolation: compile against the torch installed above (its C++ ABI must match).
MAX_JOBS=${MAX_JOBS:-2} .venv/bin/pip install -q --no-build-isolation . 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import fastpar; print('fastpar ready:', fastpar.build_info())"
