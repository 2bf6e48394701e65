"""The host emulation's programs (tests/cpp/cuda_host_emulation), compiled
for tooling/test_cuda_host_emulation.py. The builds start as soon as the
session knows it will run them (tests/conftest.py, after collection), each
under `nice -n 19` on a core of its own: they use the time the earlier tests
leave idle (waits, timeouts) and yield the cores to those tests otherwise.
Each test waits for its own program."""
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.join(ROOT, "tests", "cpp", "cuda_host_emulation")
TEST_FILE = "test_cuda_host_emulation.py"
SANITIZERS = {
    "address": ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer"],
    # -g1: line tables, so that a report names the inlined functions too.
    "thread": ["-fsanitize=thread", "-g1"],
}
PROGRAMS = ["kernels_and_ring_test", "ipc_schedules_test", "ipc_collectives_test", "ipc_p2p_test", "ipc_endpoint_test",
            "ipc_fused_test", "ipc_enqueue_failure_test", "ipc_fused_two_shot_test", "stream_ops_test"]
# The programs whose ranks, blocks, streams or watchers are threads: all but
# kernels_and_ring_test, which runs its grids one thread after another.
THREADED = [p for p in PROGRAMS if p != "kernels_and_ring_test"]
CASES = [(p, "address") for p in PROGRAMS] + [(p, "thread") for p in THREADED]

_pool = None
_out = None
_builds: dict = {}


def compiler():
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


def _build(cxx, program, sanitizer, exe):
    """Compiles one program under one sanitizer; returns (exe or None, why)."""
    nice = ["nice", "-n", "19"] if shutil.which("nice") else []
    base = nice + [cxx, "-std=c++20", "-O1", "-pthread", "-I", os.path.join(HERE, "fake_cuda"), "-I", ROOT, "-I",
                   HERE, os.path.join(HERE, program + ".cpp"), "-o", exe]
    # Under AddressSanitizer and UBSan (any undefined behaviour is fatal): the
    # schedules index peers' slots and regions with computed offsets, which a
    # bitwise check alone would only catch when the stray access changes data.
    # A compiler without the sanitizer runtimes still runs the checks; the
    # thread build has nothing to add without its runtime.
    build = subprocess.run(base + SANITIZERS[sanitizer], capture_output=True, text=True)
    if build.returncode != 0 and ("asan" in build.stderr or "ubsan" in build.stderr or "tsan" in build.stderr):
        if sanitizer == "thread":
            return None, "the compiler has no ThreadSanitizer runtime (libtsan): " + build.stderr[-300:]
        build = subprocess.run(base, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-4000:]
    return exe, ""


def start(cases) -> None:
    """Starts compiling `cases` ((program, sanitizer) pairs) not started yet,
    as many at once as there are cores."""
    global _pool, _out
    cxx = compiler()
    if cxx is None:
        return
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1)
        _out = tempfile.mkdtemp(prefix="fastpar_emulation_")
    for case in cases:
        if case not in _builds:
            _builds[case] = _pool.submit(_build, cxx, case[0], case[1], os.path.join(_out, "_".join(case)))


def build_of(case) -> Future:
    """The build of one case, started now if it was not."""
    start([case])
    return _builds[case]


def finish() -> None:
    """At the session's end: builds not begun are dropped, the running ones
    waited for, the programs removed."""
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=True, cancel_futures=True)
        _pool = None
        shutil.rmtree(_out, ignore_errors=True)
        _builds.clear()
