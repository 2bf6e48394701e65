"""The one multi-process worker of the tests: a scenario, for CPU and CUDA
tensors, in one process per rank:

    python dist_worker.py TEST_MODULE_PATH:sc_NAME RANK WORLD PORT [ARGS...]
    python dist_worker.py batch RANK WORLD PORT SPECS_JSON

A scenario is a function sc_NAME marked @scenario (dist_harness.py) in the
test module of its feature, next to the tests that check it: the worker
imports that module by its path from the repository root and calls the
function. The device comes from the environment (worker_context.py:
FASTPAR_TEST_DEVICE, FASTPAR_TEST_GPU_LAYOUT). Each scenario asserts on its
own results (a failed assert exits non-zero with the traceback on stderr);
the pytest side checks exit codes and messages.

A batch runs several scenarios in one launch (a process start, a CUDA
context and an MPS client each cost seconds): SPECS_JSON is a list of
{"id", "ref", "args", "env"}; each scenario gets the env set around it, its
own process group (a prefix of the launch's TCPStore), and reports on stdout
between "[scenario ID] begin" and "[scenario ID] ok" or "[scenario ID]
FAILED" (scenario_batch.py), so the test of each scenario fails by name. A
failed scenario aborts its group (on CUDA: the IPC engine's abort), so peers
waiting on this rank fail that scenario early and go on with the next."""
from __future__ import annotations

import importlib.util
import os
import sys

import torch
import torch.distributed as dist

import worker_context
from dist_harness import ROOT, SCENARIOS
from worker_context import ARGS, CUDA, RANK, SCENARIO, WORLD, base_store, cuda_backend


def scenario(ref: str):
    """The @scenario function `ref` ("tests/c10d/test_p2p.py:sc_direct"),
    importing its test module once."""
    if ref not in SCENARIOS:
        path, _, name = ref.rpartition(":")
        module = os.path.splitext(os.path.basename(path))[0]
        if module not in sys.modules:
            # Its folder on the path, as pytest puts it: a test module may take
            # a scenario of another of its folder (test_cuda_ipc.py: sc_allreduce).
            sys.path.insert(1, os.path.dirname(os.path.join(ROOT, path)))
            spec = importlib.util.spec_from_file_location(module, os.path.join(ROOT, path))
            sys.modules[module] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(sys.modules[module])
        assert ref in SCENARIOS, f"{path} has no function {name} marked @scenario"
    return SCENARIOS[ref]


def run_batch(specs: str):
    """The scenarios of `specs` in turn, one process group each (scenario_batch.py)."""
    from scenario_batch import run_batch as run

    def run_one(spec, prefix):
        worker_context.set_scenario(spec.get("args", []), prefix)
        scenario(spec["ref"])()

    def on_failure():
        if dist.is_initialized():
            try:
                if CUDA:
                    cuda_backend().abort()  # peers waiting on this rank fail now, not at their timeout
            finally:
                dist.destroy_process_group()

    run(specs, RANK, WORLD, base_store(), run_one, on_failure)
    if CUDA:
        torch.cuda.synchronize()


if __name__ == "__main__":
    if SCENARIO == "batch":
        run_batch(ARGS[0])
    else:
        scenario(SCENARIO)()
