"""scenario_batch.py on the CPU (dist_worker.py "batch" running the gloo probes
below, on gloo so that what fails is the batching, not fastpar): several
scenarios of this module in one launch of 2 ranks,
each reported by name; a scenario that fails on one rank is reported FAILED
there (traceback included) and the batch goes on; env set per scenario and
restored; a scenario that never ran is reported as such. (The multi-process
tests batch their scenarios this way on both devices: batched_scenarios.py.)"""
from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist

from dist_harness import RankResult, run, scenario, scenario_ref
from scenario_batch import section
from worker_context import ARGS, RANK, WORLD, finish, init


@scenario
def sc_batch_sum():
    """An all_reduce on gloo, and the env the batch set for this scenario."""
    init(backend="gloo", timeout_s=20)
    t = torch.full((4,), float(RANK + 1))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((4,), float(WORLD * (WORLD + 1) // 2))), t
    print(f"sum rank {RANK} env={os.environ.get('BATCH_TEST_KNOB', '-')}", flush=True)
    finish()


@scenario
def sc_batch_fail_on():
    """Rank ARGS[0] fails on purpose, the others pass."""
    init(backend="gloo", timeout_s=20)
    assert RANK != int(ARGS[0]), f"rank {RANK} fails on purpose"
    finish()


def test_a_batch_reports_each_scenario_by_name_and_goes_on_after_a_failure():
    specs = [
        {"id": "sum-a", "ref": scenario_ref(sc_batch_sum), "env": {"BATCH_TEST_KNOB": "7"}},
        {"id": "fail-1", "ref": scenario_ref(sc_batch_fail_on), "args": [1]},
        {"id": "sum-b", "ref": scenario_ref(sc_batch_sum)},
    ]
    results = run("batch", 2, args=[json.dumps(specs)], timeout=120)
    assert all(r.rc == 0 for r in results), [(r.rc, r.out, r.err) for r in results]
    for r in results:
        a = section(r, "sum-a")
        assert a.rc == 0 and f"sum rank {r.rank} env=7" in a.out, a.out
        b = section(r, "sum-b")
        assert b.rc == 0 and f"sum rank {r.rank} env=-" in b.out, b.out  # env restored
    failed = section(results[1], "fail-1")
    assert failed.rc == 1 and "AssertionError: rank 1 fails on purpose" in failed.out, failed.out
    assert section(results[0], "fail-1").rc == 0


def test_a_scenario_that_never_reported_is_named():
    r = RankResult(0, -9, "[scenario x] begin\n[scenario x] ok in 0.1 s\n[scenario y] begin\n", "killed")
    assert section(r, "x").rc == 0
    y = section(r, "y")
    assert y.rc == 2 and "scenario y started but never finished (launch rc=-9)" in y.out
    z = section(r, "z")
    assert z.rc == 2 and "scenario z never started" in z.out
