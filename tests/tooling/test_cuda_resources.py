"""The resource use of every kernel instance of the CUDA build, read from the
built extension (fastpar/_C*.so) with `cuobjdump -res-usage`, without a GPU:
the one-kernel collectives (the fused one-shot, the graphed one-shot and
two-shot all_reduces, the fused two-shot and the fused collectives) and the
reduce kernels (the list ops' reduce and ring-step kernels, the one-GPU ring)
run with no stack frame and no local memory, for every dtype, op and GPU architecture built. A spill
or a local copy of a kernel's argument struct shows up as a stack frame: on
the paths these kernels loop over, every spilled value is a round trip to
memory per iteration. test_cuda_sass.py reads the SASS of two instances per
kernel more closely.

Skipped where no CUDA build of fastpar exists (no extension, or a CPU-only
one), and where cuobjdump is not found, except under CI=true, where either
fails."""
import glob
import os
import re
import shutil
import subprocess

import pytest
from ci_policy import skip_or_fail
from test_cuda_sass import _cuobjdump

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The kernel families checked, as their names appear in the mangled symbols.
KERNELS = ("fused_one_shot_kernel", "fused_graph_kernel", "fused_two_shot_kernel", "graph_two_shot_kernel",
           "fused_collective_kernel", "reduce_kernel", "ring_step_kernel", "rotated_ring_kernel", "phase_kernel",
           "p2p_step_kernel")


def _extension():
    found = sorted(glob.glob(os.path.join(ROOT, "fastpar", "_C*.so")))
    return found[0] if found else None


@pytest.fixture(scope="module")
def usage():
    """{(arch, mangled name): {"REG": n, "STACK": n, "LOCAL": n, ...}} of
    every kernel of the extension."""
    so = _extension()
    if so is None:
        skip_or_fail(f"no built extension under {os.path.join(ROOT, 'fastpar')}: build fastpar with FASTPAR_CUDA=1")
    tool = _cuobjdump(shutil.which("nvcc") or "nvcc")
    if tool is None:
        skip_or_fail("cuobjdump not found (the CUDA toolkit's, or the copy in triton's wheel)")
    run = subprocess.run([tool, "-res-usage", so], capture_output=True, text=True, timeout=600)
    text = run.stdout + run.stderr
    if run.returncode != 0 and "does not contain" in text:
        skip_or_fail(f"{so} is a CPU-only build: it holds no device code")
    assert run.returncode == 0, text[-2000:]
    out, arch, name = {}, "", None
    for line in text.splitlines():
        m = re.search(r"arch = (sm_\d+)", line)
        if m:
            arch = m.group(1)
            continue
        m = re.match(r"\s*Function\s+(\S+?):?\s*$", line)
        if m:
            name = m.group(1)
            continue
        if name and "REG:" in line:
            out[(arch, name)] = {k: int(v) for k, v in re.findall(r"(\w+):(\d+)", line)}
            name = None
    if not out:
        skip_or_fail(f"{so} is a CPU-only build: it holds no kernel")
    return out


def _demangled(name):
    filt = shutil.which("c++filt")
    if filt is None:
        return name
    return subprocess.run([filt, name], capture_output=True, text=True).stdout.strip() or name


@pytest.mark.parametrize("kernel", KERNELS)
def test_no_stack_frame_or_local_memory(usage, kernel):
    instances = {k: v for k, v in usage.items() if kernel in k[1]}
    assert instances, f"no instance of {kernel} in the build"
    bad = [f"{arch} {_demangled(name)}: STACK {u.get('STACK')} LOCAL {u.get('LOCAL')} REG {u.get('REG')}"
           for (arch, name), u in sorted(instances.items()) if u.get("STACK", 0) or u.get("LOCAL", 0)]
    assert not bad, f"{len(bad)} of {len(instances)} instances of {kernel} spill or keep a stack frame:\n" + \
        "\n".join(bad[:20])
