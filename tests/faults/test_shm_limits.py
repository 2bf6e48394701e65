"""A /dev/shm smaller than what fastpar could map (Docker's default is 64 MiB).

Each test runs its ranks in a private mount namespace whose /dev/shm is a
fresh tmpfs of the size under test (`unshare --mount`, root only), so the
machine's /dev/shm is never filled. Nothing may die of SIGBUS: a short
/dev/shm is an error at init or at registered_empty that names the bytes
needed, the bytes free and what to lower, and fastpar DDP's buckets fall back
to ordinary tensors."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

import fastpar.distributed as fd
from dist_harness import scenario, scenario_ref
from worker_context import ARGS, RANK, WORLD, error_exit, init

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "common")
WORKER = os.path.join(HERE, "dist_worker.py")
MiB = 1 << 20


def _namespace_works() -> str:
    """'' if this process may mount a private /dev/shm, else why not."""
    try:
        p = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs -o size=1m tmpfs /dev/shm"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare is not available: {e}"
    return "" if p.returncode == 0 else f"cannot mount a private /dev/shm (unshare --mount as root): {p.stderr.strip()}"


_WHY_NOT = _namespace_works()
pytestmark = pytest.mark.skipif(bool(_WHY_NOT), reason=_WHY_NOT or "ok")

# Runs in the namespace: the ranks through the usual harness, then what is left in /dev/shm.
_DRIVER = """
import json, os, sys
sys.path.insert(0, {here!r})
from dist_harness import run
res = run({scenario!r}, {world}, worker={worker!r}, env={env!r}, args={args!r}, timeout={timeout})
print(json.dumps({{"ranks": [r.__dict__ for r in res], "left": sorted(os.listdir("/dev/shm"))}}))
"""


def run_in_small_shm(shm_bytes: int, body, world: int = 2, env=None, args=(), timeout: float = 60):
    code = _DRIVER.format(here=HERE, scenario=scenario_ref(body), world=world, worker=WORKER, env=dict(env or {}),
                          args=[str(a) for a in args], timeout=timeout)
    p = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                        f'mount -t tmpfs -o size={shm_bytes} tmpfs /dev/shm && exec "$0" -c "$1"', sys.executable,
                        code], capture_output=True, text=True, timeout=timeout + 30)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["left"] == [], f"left in /dev/shm: {out['left']}"
    return out["ranks"]


def _ok(ranks):
    bad = [r for r in ranks if r["rc"] != 0]
    assert not bad, "\n".join(f"rank {r['rank']} rc={r['rc']}\n{r['out']}\n{r['err']}" for r in bad)


@scenario
def sc_small_shm():
    """Run under a small /dev/shm: collectives, point to point, registered
    tensors; ARGS[0] bytes of registered tensor must fail with the reservation
    error (ValueError on every rank), and the group must still work after it."""
    init()
    t = torch.full((1 << 20,), float(RANK))  # 4 MiB: several slots
    dist.all_reduce(t)
    assert torch.all(t == sum(range(WORLD)))
    n = (2 << 20) // 4
    if RANK == 0:
        dist.send(torch.ones(n), 1)
    elif RANK == 1:
        got = torch.empty(n)
        dist.recv(got, 0)
        assert torch.all(got == 1)
    r = fd.registered_empty((4 << 20,), torch.uint8)  # 4 MiB fits
    r.fill_(RANK)
    dist.all_reduce(r)
    assert torch.all(r == sum(range(WORLD)) % 256)
    del r
    try:
        fd.registered_empty((int(ARGS[0]),), torch.uint8)
        raise AssertionError("a registered tensor larger than /dev/shm was allocated")
    except ValueError as e:
        print(f"ERROR: {e}", flush=True)
    t = torch.ones(10)
    dist.all_reduce(t)
    assert torch.all(t == WORLD)
    print("small shm ok", flush=True)
    dist.destroy_process_group()


def test_defaults_work_in_a_64_mib_dev_shm():
    # Collectives, point to point and a registered tensor with the default
    # knobs; then a registered tensor larger than /dev/shm: ValueError on
    # every rank (not SIGBUS), and the group goes on.
    ranks = run_in_small_shm(64 * MiB, sc_small_shm, args=[80 * MiB])
    _ok(ranks)
    for r in ranks:
        assert "small shm ok" in r["out"], r["out"]
        err = [line for line in r["out"].splitlines() if line.startswith("ERROR:")]
        assert len(err) == 1, r["out"]
        assert "83886080 bytes do not fit in /dev/shm" in err[0] and "no rank allocated it" in err[0], err[0]
    # The rank that tried says how much room there was.
    assert any(re.search(r"/dev/shm has \d+ bytes free of 67108864", r["out"]) for r in ranks), ranks


@scenario
def sc_small_shm_init():
    """Init under a /dev/shm too small for the segments (the test sets large slots)."""
    t0 = time.monotonic()
    try:
        init()
    except dist.DistBackendError as e:
        error_exit(t0, e)
    sys.exit(0)


def test_init_fails_clearly_when_dev_shm_is_too_small():
    # 3 slots of 16 MiB per rank: 2 ranks need 96 MiB of a 64 MiB /dev/shm.
    ranks = run_in_small_shm(64 * MiB, sc_small_shm_init, env={"FASTPAR_SHM_SLOT_BYTES": str(16 * MiB)})
    need = 4096 + 3 * 16 * MiB + (128 + 4 * 64 + 4 * 256 * 1024 + 4095) // 4096 * 4096  # header, slots, 1 channel
    for r in ranks:
        assert r["rc"] == 3, (r["rank"], r["rc"], r["err"])
        assert f"cannot reserve the {need} bytes of shared memory this rank needs" in r["err"], r["err"]
        assert re.search(r"/dev/shm has \d+ bytes free of 67108864", r["err"]), r["err"]
        assert "FASTPAR_SHM_SLOT_BYTES (16777216)" in r["err"] and "FASTPAR_SHM_P2P_CHUNK_BYTES" in r["err"], r["err"]
        # At once, not after the group's timeout: the rank that failed told the other.
        assert float(re.search(r"ERROR after ([0-9.]+)s", r["err"]).group(1)) < 8, r["err"]


@scenario
def sc_small_shm_ddp():
    """fastpar DDP under a small /dev/shm with buckets larger than it: the
    buckets fall back to ordinary tensors (one warning) and training works."""
    import warnings

    import fastpar

    init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.Linear(4096, 1024))  # 32 MiB of grads
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ddp = fastpar.DistributedDataParallel(model, bucket_cap_mb=1000)
    msgs = [str(w.message) for w in caught if "fall back to ordinary tensors" in str(w.message)]
    assert len(msgs) == 1, [str(w.message) for w in caught]
    print(f"WARNING: {msgs[0]}", flush=True)
    assert ddp.bucket_storage_kind == "torch.empty", ddp.bucket_storage_kind
    x = torch.randn(8, 1024) + RANK
    ddp(x).sum().backward()
    g = model[0].weight.grad.clone()
    dist.all_reduce(g, op=dist.ReduceOp.MAX)
    h = model[0].weight.grad.clone()
    dist.all_reduce(h, op=dist.ReduceOp.MIN)
    assert torch.equal(g, h), "ranks hold different averaged gradients"
    print("small shm ddp ok", flush=True)
    dist.destroy_process_group()


def test_ddp_buckets_fall_back_to_ordinary_tensors():
    # 32 MiB of gradients in large buckets, 2 ranks, 64 MiB of /dev/shm: the
    # buckets that do not fit become ordinary tensors (one warning) and the
    # gradients still agree.
    ranks = run_in_small_shm(64 * MiB, sc_small_shm_ddp)
    _ok(ranks)
    for r in ranks:
        assert "small shm ddp ok" in r["out"], r["out"]
        assert "do not fit in /dev/shm" in r["out"], r["out"]
