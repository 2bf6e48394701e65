"""The CPU reduce loops give the same bits on every instruction set fastpar can
pick (FASTPAR_CPU_ISA=scalar|avx2|avx512|avx512_bf16, each in its own process since the
choice is made once per process), and the same bits as torch's fp32
reference for float16/bfloat16: widen, sum in rank order, round once."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import fastpar

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ISAS = ["scalar", "avx2", "avx512", "avx512_bf16"]  # each has every instruction of the ones before

# Run in a child: every op and dtype on tensors with odd lengths and an
# unaligned view, a digest of every result's bytes, and whether each matched
# torch's reference computed in fp32.
CHILD = r"""
import hashlib, json, sys, torch, fastpar
from torch.distributed import ReduceOp
torch.manual_seed(7)
out = {"isa": fastpar._C.cpu_isa(), "digest": {}, "ref_ok": {}}
ops = {"SUM": ReduceOp.SUM, "AVG": ReduceOp.AVG, "PRODUCT": ReduceOp.PRODUCT, "MIN": ReduceOp.MIN, "MAX": ReduceOp.MAX}
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for k in (2, 3, 9):
        base = [torch.randn(40_003) * 3 for _ in range(k)]
        for name, op in ops.items():
            ts = [b.to(dtype)[1:] for b in base]   # storage offset 1: unaligned
            ref = ts[0].float()
            for t in ts[1:]:
                ref = {"SUM": ref + t.float(), "AVG": ref + t.float(), "PRODUCT": ref * t.float(),
                       "MIN": torch.minimum(ref, t.float()), "MAX": torch.maximum(ref, t.float())}[name]
            if name == "AVG":
                ref = ref / k
            ref = ref.to(dtype)
            fastpar.allreduce(ts, op=op)
            key = f"{dtype}-{k}-{name}"
            out["digest"][key] = hashlib.sha256(b"".join(t.contiguous().view(torch.uint8).numpy().tobytes() for t in ts)).hexdigest()
            out["ref_ok"][key] = all(torch.equal(t.view(torch.int16 if dtype.itemsize == 2 else torch.int32),
                                                 ref.view(torch.int16 if dtype.itemsize == 2 else torch.int32)) for t in ts)
            ring = [b.to(dtype) for b in base]    # the ring's fold steps (fp32 partials between steps)
            fastpar.allreduce(ring, op=op, algorithm="ring")
            out["digest"][key + "-ring"] = hashlib.sha256(b"".join(t.view(torch.uint8).numpy().tobytes() for t in ring)).hexdigest()
print(json.dumps(out))
"""


def run_child(isa: str | None, code: str = CHILD) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="2")
    env.pop("FASTPAR_CPU_ISA", None)
    if isa is not None:
        env["FASTPAR_CPU_ISA"] = isa
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def supported() -> list[str]:
    return ISAS[: ISAS.index(fastpar._C.cpu_isa_supported()) + 1]


def test_isa_reported():
    assert fastpar._C.cpu_isa() in supported()


def test_every_isa_gives_the_same_bits_and_torchs_reference():
    import json

    results = {}
    for isa in supported():
        p = run_child(isa)
        assert p.returncode == 0, p.stderr[-2000:]
        results[isa] = json.loads(p.stdout)
        assert results[isa]["isa"] == isa
        bad = [k for k, ok in results[isa]["ref_ok"].items() if not ok]
        assert not bad, f"{isa}: differs from torch's fp32 reference for {bad}"
    first = supported()[0]
    for isa in supported()[1:]:
        diff = [k for k in results[first]["digest"] if results[first]["digest"][k] != results[isa]["digest"][k]]
        assert not diff, f"{isa} and {first} differ for {diff}"


def test_bad_isa_names_the_variable():
    code = "import torch, fastpar; fastpar.allreduce([torch.ones(8), torch.ones(8)])"
    p = run_child("sse9", code)
    assert p.returncode != 0
    assert "FASTPAR_CPU_ISA is 'sse9'" in p.stderr, p.stderr[-2000:]


@pytest.mark.skipif(fastpar._C.cpu_isa_supported() == ISAS[-1], reason="this CPU has every ISA")
def test_isa_beyond_the_cpu_is_an_error():
    p = run_child(ISAS[-1], "import torch, fastpar; fastpar.allreduce([torch.ones(8), torch.ones(8)])")
    assert p.returncode != 0
    assert "supports at most" in p.stderr, p.stderr[-2000:]
