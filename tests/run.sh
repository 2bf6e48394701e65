#!/usr/bin/env bash
# The whole test suite: the torch-free core under AddressSanitizer/UBSan
# (CMake + ctest), then the Python suite against the installed fastpar.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build/cpp -DFASTPAR_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build/cpp -j 2
ctest --test-dir build/cpp --output-on-failure
.venv/bin/python -m pytest -q -p no:cacheprovider tests/python "$@"
