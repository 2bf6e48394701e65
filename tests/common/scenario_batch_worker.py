"""Scenarios for tooling/test_scenario_batch.py (CPU, gloo, without fastpar: the
batch mechanism alone): a batch of them in one launch.

    python scenario_batch_worker.py batch RANK WORLD PORT SPECS_JSON"""
import datetime
import os
import sys

import torch
import torch.distributed as dist

from scenario_batch import run_batch

RANK, WORLD, PORT = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])


def sc_sum(args, store):
    dist.init_process_group("gloo", store=store, rank=RANK, world_size=WORLD, timeout=datetime.timedelta(seconds=20))
    t = torch.full((4,), float(RANK + 1))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((4,), float(WORLD * (WORLD + 1) // 2))), t
    print(f"sum rank {RANK} env={os.environ.get('BATCH_TEST_KNOB', '-')}", flush=True)
    dist.destroy_process_group()


def sc_fail_on(args, store):
    dist.init_process_group("gloo", store=store, rank=RANK, world_size=WORLD, timeout=datetime.timedelta(seconds=20))
    assert RANK != int(args[0]), f"rank {RANK} fails on purpose"
    dist.destroy_process_group()


if __name__ == "__main__":
    base = dist.TCPStore("127.0.0.1", PORT, WORLD, RANK == 0, timeout=datetime.timedelta(seconds=60),
                         wait_for_workers=False)

    def run_one(spec, prefix):
        globals()["sc_" + spec["name"]](spec.get("args", []), dist.PrefixStore(prefix, base))

    def on_failure():
        if dist.is_initialized():
            dist.destroy_process_group()

    run_batch(sys.argv[5], RANK, WORLD, base, run_one, on_failure)
