"""Pieces of the DDP wrapper and the training benchmark that need no second process."""
import tempfile

import pytest
import torch
import torch.distributed as dist
from torch import nn

import fastpar
from bench_import import benchmark_module
from fastpar.ddp import _assign_buckets

tb = benchmark_module("training.modes")


def test_first_bucket_is_small_and_buckets_split_by_dtype():
    mib = 1024 * 1024
    params = [torch.empty(mib // 4 * 3 // 5, dtype=torch.float32) for _ in range(4)]  # 0.6 MiB each
    assert _assign_buckets(params, 25 * mib) == [[0], [1, 2, 3]]
    mixed = [torch.empty(10), torch.empty(10, dtype=torch.float64), torch.empty(10)]
    assert _assign_buckets(mixed, 25 * mib) == [[0], [1], [2]]


def test_ddp_refuses_bad_arguments_before_any_work():
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        fastpar.DistributedDataParallel(nn.Linear(2, 2))
    dist.init_process_group("gloo", store=dist.FileStore(tempfile.mktemp(), 1), rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="bucket_cap_mb is 0; it must be a positive number of MiB"):
            fastpar.DistributedDataParallel(nn.Linear(2, 2), bucket_cap_mb=0)
        with pytest.raises(ValueError, match=r"device_ids must hold exactly one device .* got \[0, 1\]"):
            fastpar.DistributedDataParallel(nn.Linear(2, 2), device_ids=[0, 1])
        with pytest.raises(ValueError, match="parameter 'weight' is on 'cpu' but device_ids\\[0\\] is 'cuda:0'"):
            fastpar.DistributedDataParallel(nn.Linear(2, 2), device_ids=[0])
        model = fastpar.DistributedDataParallel(nn.Linear(2, 2))  # world of one: averaging is the identity
        model(torch.ones(3, 2)).sum().backward()
        assert torch.equal(model.module.weight.grad, torch.full((2, 2), 3.0))
        assert model.bucket_storage_kind == "torch.empty"
    finally:
        dist.destroy_process_group()


def test_each_step_is_timed_by_its_slowest_rank():
    rank0 = {"mode": "no_comm", "steps": 3, "global_batch": 128, "step_times": [0.1, 0.4, 0.1], "accuracy": 0.9}
    rank1 = dict(rank0, step_times=[0.3, 0.1, 0.2], accuracy=None)
    out = tb._combine({0: rank0, 1: rank1})  # slowest per step: 0.3, 0.4, 0.2
    assert out["accuracy"] == 0.9 and out["seconds"] == pytest.approx(0.9) and "step_times" not in out
    assert out["slowest_step_s"] == [0.3, 0.4, 0.2] and "slowest_step_s" not in tb.csv_row(out)
    assert out["samples_per_s"] == pytest.approx(128 / 0.3)
    assert out["wall_samples_per_s"] == pytest.approx(3 * 128 / 0.9)


def _row(mode, steps, run=1):
    return {"mode": mode, "label": tb.MODES[mode], "backend": "gloo", "world": 2, "samples_per_s": 1 / min(steps),
            "wall_samples_per_s": 1 / min(steps), "accuracy": 0.5, "slowest_step_s": steps, "run": run}


def test_paired_ratio_is_the_median_of_per_step_ratios():
    # the machine slows down 3x halfway: each step's ratio is still 2 or 1.5, whatever the medians of each mode
    stock = _row("stock_ddp_gloo", [0.2, 0.2, 0.6, 0.6, 0.6])
    fast = _row("fastpar_ddp", [0.1, 0.1, 0.4, 0.3, 0.3])
    assert tb.paired_ratio(fast, stock) == pytest.approx(2.0)  # per step: 2, 2, 1.5, 2, 2
    assert tb.paired_ratio(stock, fast) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="'fastpar_ddp' and 'stock_ddp_gloo' were not timed step by step in one run"):
        tb.paired_ratio(fast, dict(stock, run=2))


def test_table_shows_ratio_to_the_baseline_and_paired_ratio():
    rows = [_row("no_comm", [0.005, 0.005]), _row("stock_ddp_gloo", [0.01, 0.01]),
            dict(_row("single", [0.02, 0.02], run=2))]
    tb.add_paired_ratios(rows, "stock_ddp_gloo")
    assert [r["vs_stock_ddp_gloo_paired"] for r in rows] == [2.0, 1.0, None]  # one process: another run
    table = tb.format_table(rows, baseline_mode="no_comm", paired_baseline="stock_ddp_gloo")
    lines = table.splitlines()
    assert "vs stock_ddp_gloo, paired" in lines[0]
    assert "2.000x" in lines[2] and "0.500x" in lines[3] and lines[4].split()[-2] == "-"
    assert "50.00%" in table


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="mode is 'nccl_ddp'"):
        tb.run_modes(["fastpar_ddp", "nccl_ddp"], tb.Config(), "unused")


@pytest.mark.parametrize("backend", ["fastpar", "cpu:fastpar", "cpu:fastpar,cuda:gloo"])
def test_buckets_are_registered_whenever_cpu_tensors_run_on_fastpar(backend):
    # dist.get_backend gives the whole string for mixed backends; the CPU
    # backend object is what decides (CUDA groups are tested on a GPU).
    dist.init_process_group(backend, store=dist.FileStore(tempfile.mktemp(), 1), rank=0, world_size=1)
    try:
        assert fastpar.DistributedDataParallel(nn.Linear(2, 2)).bucket_storage_kind == "registered"
    finally:
        dist.destroy_process_group()
