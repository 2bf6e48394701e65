#!/usr/bin/env bash
# The whole test suite: the torch-free core under AddressSanitizer/UBSan,
# then under ThreadSanitizer (CMake + ctest), every source compiled against
# the GPU machine's torch headers, then the Python suite against the installed
# fastpar and programs of other projects (FSDP2, DTensor, Lightning,
# Accelerate) run on it.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build/cpp -DFASTPAR_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build/cpp -j 2
ctest --test-dir build/cpp --output-on-failure
cmake -S . -B build/cpp-tsan -DFASTPAR_SANITIZE=thread -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build/cpp-tsan -j 2
TSAN_OPTIONS=halt_on_error=1 ctest --test-dir build/cpp-tsan --output-on-failure
# The GPU machine builds with an older torch (C++17, an older c10d) than this
# one: every source must compile against its headers too (downloads them once).
.venv/bin/python scripts/check_torch_compat.py
.venv/bin/python -m pytest -q -p no:cacheprovider tests/list_ops tests/c10d tests/wrappers tests/faults tests/tooling tests/multihost \
  tests/clients "$@"
