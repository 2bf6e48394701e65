"""What nvcc makes of the one-kernel collectives: the fused one-shot all_reduce
and the one CUDA graphs capture (csrc/core/executors/cuda_ipc/ipc_fused_one_shot.cu),
the fused two-shot all_reduce and the one CUDA graphs capture
(csrc/core/executors/cuda_ipc/ipc_fused_two_shot.cu) and the fused broadcast,
gather, scatter, all_to_all, reduce and reduce_scatter
(csrc/core/executors/cuda_ipc/ipc_fused_collectives.cu), read from their
cubins for sm_90 (H100) with cuobjdump, without a GPU:
  * registers: each kernel is launched as blocks of a fixed number of threads,
    a minimum of them per SM (the file's constants), and the grids of every
    rank sharing one GPU (kTwoShotMaxBlocks blocks together) must be resident at once,
    since block b of each rank waits for block b of the others. That holds
    only if the registers per thread fit the SM's 65536 at that many blocks,
    and kTwoShotMaxBlocks fits an H100's 132 SMs;
  * scope: every flag at system scope (the scope between processes);
  * loads: the copy and reduce loops move 16-byte packs (LDG.E.128) with at
    least 4 of them issued before the first store that follows, so a thread
    has 64 bytes of loads in flight rather than one 16-byte round trip;
  * waits: a spin loop stays a loop (one __nanosleep per wait in the source,
    not one per unrolled spin).
Each file is compiled with -DFASTPAR_SASS_PROBE (two instances of each kernel:
seconds instead of minutes of nvcc). Skipped without nvcc or cuobjdump, except
under CI=true, where a missing tool fails."""
import glob
import os
import re
import shutil
import subprocess
import sys

import pytest
from ci_policy import under_ci

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IPC = os.path.join(ROOT, "csrc", "core", "executors", "cuda_ipc")
# (file, kernel name, its threads-per-block and blocks-per-SM constants)
KERNELS = {
    "one_shot": ("ipc_fused_one_shot.cu", "fused_one_shot_kernel", "kFusedThreads", "kFusedMinBlocksPerSm"),
    "graph": ("ipc_fused_one_shot.cu", "fused_graph_kernel", "kFusedThreads", "kFusedMinBlocksPerSm"),
    "two_shot": ("ipc_fused_two_shot.cu", "fused_two_shot_kernel", "kTwoShotThreads", "kTwoShotMinBlocksPerSm"),
    "graph_two_shot": ("ipc_fused_two_shot.cu", "graph_two_shot_kernel", "kTwoShotThreads", "kTwoShotMinBlocksPerSm"),
    "collectives": ("ipc_fused_collectives.cu", "fused_collective_kernel", "kFusedCollThreads",
                    "kFusedCollMinBlocksPerSm"),
}
ARENA = os.path.join(ROOT, "csrc", "core", "transport", "cuda_ipc", "ipc_arena.h")
SM90_REGISTERS_PER_SM = 65536
H100_SMS = 132


def _missing(what):
    if under_ci():
        pytest.fail(f"{what} is needed under CI=true")
    pytest.skip(f"{what} not found: the SASS checks need the CUDA toolkit")


def _cuobjdump(nvcc):
    found = shutil.which("cuobjdump")
    if found:
        return found
    # nvcc may be a wrapper on PATH: look beside the real one, then in the
    # copy that triton wheels carry.
    real = os.path.realpath(nvcc)
    candidates = [os.path.join(os.path.dirname(real), "cuobjdump"), "/usr/local/cuda/bin/cuobjdump"]
    for site in sys.path:
        candidates += glob.glob(os.path.join(site, "triton", "backends", "nvidia", "bin", "cuobjdump"))
    return next((c for c in candidates if os.path.isfile(c) and os.access(c, os.X_OK)), None)


def _constant(path, name):
    m = re.search(rf"constexpr\s+(?:int|size_t)\s+{name}\s*=\s*(\d+)\s*;", open(path).read())
    assert m, f"{name} not found in {path}"
    return int(m.group(1))


@pytest.fixture(scope="module", params=sorted(KERNELS))
def cubin(request, tmp_path_factory):
    """(kernel spec, resource usage, SASS) of one probe build."""
    spec = KERNELS[request.param]
    cu = os.path.join(IPC, spec[0])
    nvcc = shutil.which("nvcc")
    if not nvcc:
        _missing("nvcc")
    tool = _cuobjdump(nvcc)
    if not tool:
        _missing("cuobjdump")
    out = str(tmp_path_factory.mktemp("sass") / f"{request.param}.cubin")
    build = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "-cubin", "-DFASTPAR_SASS_PROBE", "-I",
                            os.path.join(ROOT, "csrc"), cu, "-o", out], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-4000:]
    usage = subprocess.run([tool, "-res-usage", out], capture_output=True, text=True, check=True).stdout
    sass = subprocess.run([tool, "-sass", out], capture_output=True, text=True, check=True).stdout
    return spec, usage, sass


def _functions(text, header):
    """{mangled name: its lines} for every block of `text` that starts with `header`."""
    out, name = {}, None
    for line in text.splitlines():
        m = re.match(rf"\s*{header}\s*:?\s*(\S+?):?\s*$", line)
        if m:
            name = m.group(1)
            out[name] = []
        elif name:
            out[name].append(line)
    return out


def test_registers_fit_the_launch_shape(cubin):
    (cu, kernel, threads_name, per_sm_name), usage, _ = cubin
    threads = _constant(os.path.join(IPC, cu), threads_name)
    per_sm = _constant(os.path.join(IPC, cu), per_sm_name)
    max_blocks = _constant(ARENA, "kTwoShotMaxBlocks")
    kernels = {k: v for k, v in _functions(usage, "Function").items() if kernel in k}
    assert len(kernels) == 2, list(kernels)  # the two probe instances
    for name, lines in kernels.items():
        regs = int(re.search(r"REG:(\d+)", "\n".join(lines)).group(1))
        assert regs * threads * per_sm <= SM90_REGISTERS_PER_SM, (
            f"{name} uses {regs} registers a thread: {per_sm} blocks of {threads} threads need "
            f"{regs * threads * per_sm} > {SM90_REGISTERS_PER_SM} per SM")
    # Every rank's grid resident at once even when all ranks share one H100.
    assert max_blocks <= H100_SMS * per_sm, (max_blocks, H100_SMS, per_sm)


def test_loops_keep_four_16_byte_loads_in_flight(cubin):
    (_, kernel, _, _), _, sass = cubin
    kernels = {k: v for k, v in _functions(sass, "Function").items() if kernel in k}
    assert len(kernels) == 2, list(kernels)
    for name, lines in kernels.items():
        wide = [l for l in lines if re.search(r"\bLDG\.E\.128\b|\bLD\.E\.128\b", l)]
        assert wide, f"{name}: no 16-byte loads (LDG.E.128)"
        run = best = 0
        for line in lines:
            if re.search(r"\b(LDG|LD)\.E\.128\b", line):
                run += 1
                best = max(best, run)
            elif re.search(r"\b(STG|ST)\.E", line):
                run = 0
        assert best >= 4, f"{name}: at most {best} 16-byte loads issued before a store"
        assert any(re.search(r"\bSTG\.E\.128\b", l) for l in lines), f"{name}: no 16-byte stores"


def test_flags_are_ordered_at_system_scope(cubin):
    """The flags are read and written by kernels of other processes: every
    strong load and store is at system scope. The GPU-scope operations are
    on words only this rank's kernels touch: the status word's
    compare-and-swap, and in the graphed kernels the count of finished blocks
    (ipc_graph.h, graph_finish: a 64-bit add)."""
    (_, kernel, _, _), _, sass = cubin
    kernels = {k: "\n".join(v) for k, v in _functions(sass, "Function").items() if kernel in k}
    assert len(kernels) == 2, list(kernels)
    local = r"\bATOMG?\.E\.(CAS|ADD\.64)\b" if "graph" in kernel else r"\bATOMG?\.E\.CAS\b"
    for name, body in kernels.items():
        assert re.search(r"\.STRONG\.SYS\b", body), f"{name}: no system-scope operation"
        gpu = [l.strip() for l in body.splitlines() if re.search(r"\.STRONG\.GPU\b", l)]
        assert all(re.search(local, l) for l in gpu), f"{name}: GPU scope in {gpu[:3]}"
        if "graph" in kernel:
            adds = [l for l in gpu if "ADD.64" in l]
            assert len(adds) == 1, f"{name}: the count of finished blocks is added once, not {adds}"


def test_wait_loops_stay_loops(cubin):
    """nvcc unrolls a loop with a constant trip count, and a wait's spins
    (flags::kPollSpins) are one: unrolled, every wait inlined into a kernel
    was copied many times over (32-288 __nanosleep a kernel), for no gain in
    how soon it sees a flag. FASTPAR_SPIN_LOOP (flag_protocol.h) keeps them
    loops: a kernel has a __nanosleep per wait it makes, a handful."""
    (_, kernel, _, _), _, sass = cubin
    kernels = {k: v for k, v in _functions(sass, "Function").items() if kernel in k}
    assert len(kernels) == 2, list(kernels)
    for name, lines in kernels.items():
        sleeps = sum(1 for l in lines if re.search(r"\bNANOSLEEP\b", l))
        assert 1 <= sleeps <= 8, f"{name}: {sleeps} NANOSLEEP instructions"
