"""Every program under examples/ runs, in a short form, and its output says it
worked; and the main job (benchmarks/main_job.py --smoke: the --quick path
cut to a few steps) writes its table. Each example is run as a user runs it
(its header's command) with fewer steps or samples."""
import csv
import glob
import os
import re
import subprocess
import sys

import pytest

from dist_harness import ROOT, child_env

# examples/tensor_parallel_inference.py runs in tests/wrappers/test_tensor_parallel_example.py
ELSEWHERE = {"tensor_parallel_inference.py": "tests/wrappers/test_tensor_parallel_example.py"}


def run(args, timeout=240, cwd=None):
    r = subprocess.run([sys.executable] + args, env=child_env(), capture_output=True, text=True,
                       timeout=timeout, cwd=cwd or ROOT)
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout[-4000:]}\nstderr:\n{r.stderr[-4000:]}"
    return r.stdout


def example(name):
    return os.path.join(ROOT, "examples", name)


def test_every_example_has_a_test():
    tested = {name for name in globals() if name.startswith("test_")}
    for path in sorted(glob.glob(os.path.join(ROOT, "examples", "*.py"))):
        name = os.path.basename(path)
        if name in ELSEWHERE:
            assert os.path.exists(os.path.join(ROOT, ELSEWHERE[name])), ELSEWHERE[name]
            continue
        assert "test_" + name[:-3] in tested, f"examples/{name} has no test in {__file__}"


def test_cnn_data_parallel(tmp_path):
    ckpt = tmp_path / "cnn.pt"
    out = run([example("cnn_data_parallel.py"), "--steps", "20", "--checkpoint", str(ckpt)])
    assert len(re.findall(r"loss (\d+\.\d+)", out)) >= 2, out  # every 10th step and the last
    acc = float(re.search(r"accuracy on 256 fresh samples: ([\d.]+)%", out).group(1))
    assert acc > 50, out  # 3 classes: chance is 33%
    assert f"checkpoint {ckpt} loads into a bare SmallCNN" in out and ckpt.stat().st_size > 0


def test_lenet_textbook():
    out = run([example("lenet_textbook.py"), "--epochs", "1", "--train-samples", "2048"])
    assert "SYNTHETIC" in out
    acc = float(re.search(r"epoch 1: test accuracy ([\d.]+)%", out).group(1))
    assert acc > 20, out  # 10 classes: chance is 10%
    assert "parameter copies identical on every device: True" in out


@pytest.mark.usefixtures("no_leftover_segments")
def test_ddp_torchrun():
    out = run(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", example("ddp_torchrun.py"),
               "--epochs", "1", "--train-samples", "6000"])
    assert "backend fastpar, 2 ranks" in out, out
    acc = float(re.search(r"epoch 1: test accuracy ([\d.]+)%", out).group(1))
    assert acc > 30, out  # 10 classes: chance is 10% (47 steps reach about 60%)


@pytest.mark.usefixtures("no_leftover_segments")
def test_single_vs_dp_vs_ddp():
    out = run([example("single_vs_dp_vs_ddp.py"), "--steps", "3"])
    diffs = [float(x) for x in re.findall(r"max \|param diff\| = (\S+)", out)]
    assert len(diffs) == 2 and max(diffs) < 1e-4, out
    assert "DDP (fastpar) vs one device" in out
    assert "DDP ranks bitwise identical:     True" in out


@pytest.mark.usefixtures("no_leftover_segments")
def test_main_job_smoke(tmp_path):
    out = run([os.path.join(ROOT, "benchmarks", "main_job.py"), "--smoke", "--out", str(tmp_path)], timeout=300)
    with open(tmp_path / "train_main.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["mode"] for r in rows} == {"fastpar_ddp", "stock_ddp_gloo", "no_comm", "single"}, rows
    assert all(float(r["samples_per_s"]) > 0 for r in rows), rows
    # paired with stock DDP: the modes of its run; one process ran in processes of its own
    paired = {r["mode"]: r["vs_stock_ddp_gloo_paired"] for r in rows}
    assert float(paired["stock_ddp_gloo"]) == 1.0 and float(paired["fastpar_ddp"]) > 0 and paired["single"] == ""
    assert "vs stock_ddp_gloo, paired" in out
    assert "collective sweep:" in out
    with open(tmp_path / "collective_sweep.csv") as f:
        sweep = list(csv.DictReader(f))
    assert sweep, "the collective sweep wrote no rows"
    # beside every time, the copy rate of the same run and the fraction of the traffic floor
    assert all(float(r["copy_GBps"]) > 0 and float(r["fastpar_of_ceiling"]) > 0 for r in sweep), sweep
