"""Probes of the batch mechanism itself (tooling/test_scenario_batch.py runs
them through dist_worker.py "batch"): on gloo, so that what fails there is
the batching (reports, env set and restored, going on after a failure), not
fastpar."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from worker_context import ARGS, RANK, WORLD, finish, init


def sc_batch_sum():
    """An all_reduce on gloo, and the env the batch set for this scenario."""
    init(backend="gloo", timeout_s=20)
    t = torch.full((4,), float(RANK + 1))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((4,), float(WORLD * (WORLD + 1) // 2))), t
    print(f"sum rank {RANK} env={os.environ.get('BATCH_TEST_KNOB', '-')}", flush=True)
    finish()


def sc_batch_fail_on():
    """Rank ARGS[0] fails on purpose, the others pass."""
    init(backend="gloo", timeout_s=20)
    assert RANK != int(ARGS[0]), f"rank {RANK} fails on purpose"
    finish()
