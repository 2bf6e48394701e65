#!/usr/bin/env bash
# The whole test suite: the torch-free core under AddressSanitizer/UBSan,
# then under ThreadSanitizer (CMake + ctest), every source compiled against
# the GPU machine's torch headers, then the Python suite against the installed
# fastpar and programs of other projects (FSDP2, DTensor, Lightning,
# Accelerate) run on it.
#   bash tests/run.sh --quick   every feature once (the tests marked `quick`,
#                               tests/common/quick_tier.py) and the core's
#                               tests in a plain build, without sanitizers
# Further arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--quick" ]; then
  shift
  # The core's tests but test_cpu_reduce_simd (the slowest to compile; the
  # quick tier checks every CPU ISA through fastpar: tests/list_ops/test_cpu_isa.py).
  cmake -S . -B build/cpp-quick -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build build/cpp-quick -j 2 --target $(ls tests/cpp | sed -n 's/^\(test_.*\)\.cpp$/\1/p' | grep -vx test_cpu_reduce_simd)
  ctest --test-dir build/cpp-quick --output-on-failure -E '^test_cpu_reduce_simd$'
  exec .venv/bin/python -m pytest -q -p no:cacheprovider -m quick tests/list_ops tests/c10d tests/wrappers \
    tests/faults tests/tooling "$@"
fi
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
