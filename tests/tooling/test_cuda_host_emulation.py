"""The GPU code compiled for the host against a fake CUDA runtime
(tests/cpp/cuda_host_emulation), under AddressSanitizer and UBSan, and checked
bit for bit against the CPU code, on any machine with a C++20 compiler, GPU or
not:
  * the reduce and ring-step kernels, run thread by thread (index math,
    16-byte and scalar paths, aliasing) and the cuda_p2p ring executor;
  * the CUDA IPC allreduce schedules (the shared algorithms/*_slots.h over
    IpcSteps) with one thread per rank over the shared flag protocol (slot
    rotation, chunking, registered buffers, mismatch records);
  * the fused one-shot and graphed all_reduce kernels with every block on a
    thread of its own: 16-byte pack and scalar paths bit for bit (float32,
    bfloat16, int8, aligned and odd offsets), the first failure of a rank
    winning over its blocks (status word = host mirror, mismatch record kept),
    and a failed or post-failure replay leaving its status in the failure word;
  * the CUDA IPC broadcast / all_gather / gather / scatter / all_to_all /
    reduce / reduce_scatter schedules, step by step and as one kernel per call
    (ipc_fused_collectives.h), interleaved with allreduce, desynced calls (a
    mix of the two forms among them), and the host abort word that the peer
    watcher raises when a peer process dies;
  * the CUDA IPC send/recv rings (ipc_p2p.cpp, p2p_ring.h) with one thread per
    rank, peer and direction: all pairs at once, ring credit, tag and size
    mismatches, a dead peer;
  * the IPC endpoint's pinned host words (abort word, status mirror): alive
    until the endpoint itself goes, so abort() and Works racing a shutdown
    never touch freed memory; its destructor never frees an exported arena,
    and its device hops make no context on a GPU the thread never chose;
  * a launch refused partway through an IPC call (every position, collectives
    and send/recv): the rank's communicator fails for good and its peers'
    calls end with kPeerAborted instead of waiting for the timeout; an error
    other code left on the thread is not taken for a launch failure.
  * the one-kernel calls (one-shot, two-shot, collectives, graphed) in both
    forms of their block barriers (the peer's flag polled, or flags written
    into the waiter's memory): bits, desyncs, aborts, deadlines, and ranks in
    different forms failing with a mismatch or a peer's abort;
  * the fused two-shot all_reduce kernel bit for bit against the step-by-step
    two-shot, with its failures (ipc_fused_two_shot_test), and the stream
    operations and bytes of every IPC collective and the list ring per call,
    pinned (stream_ops_test).
The programs that run ranks, blocks or streams on threads of their own are
built a second time under ThreadSanitizer: every read of a peer's slot, of a
record or of a word another thread writes must be ordered after the write by
the flag protocol's release and acquire (or be atomic itself), whatever the
interleaving this run happened to take. A bitwise check sees a missing order
only when the timing exposes it; the race detector sees it every run. No
race is suppressed; the one race by design (a desynced call's blocks reading
a peer's slot before the call fails) is left out of that build, as
emulated_checks.h says.
Streams, events, peer access, IPC mappings and the PTX memory-ordering policy
still need real GPUs: list_ops/test_cuda.py, the cuda shapes of the c10d tests,
c10d/test_cuda_ipc.py. This runs outside ctest: it needs a C++20 compiler
and the fake CUDA headers, which CMakeLists.txt does not build."""
import os
import subprocess

import emulation_builds
import pytest
from ci_policy import skip_or_fail
from emulation_builds import CASES


@pytest.mark.parametrize("program,sanitizer", CASES)
def test_cuda_code_on_host(program, sanitizer):
    if emulation_builds.compiler() is None:
        pytest.skip("no C++ compiler")
    # Compiling since the session's collection (tests/common/emulation_builds.py).
    exe, why = emulation_builds.build_of((program, sanitizer)).result()
    if exe is None:
        skip_or_fail(why)
    # halt_on_error: a race fails the program at once, its report the last
    # thing on stderr, instead of a count at exit.
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1")
    run = subprocess.run([exe], capture_output=True, text=True, timeout=900, env=env)
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    assert " 0 failures" in run.stdout
