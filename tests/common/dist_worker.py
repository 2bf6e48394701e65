"""The one multi-process worker of the tests: every scenario, for CPU and CUDA
tensors, one process per rank:

    python dist_worker.py SCENARIO RANK WORLD PORT [ARGS...]
    python dist_worker.py batch RANK WORLD PORT SPECS_JSON

The device comes from the environment (worker_context.py:
FASTPAR_TEST_DEVICE, FASTPAR_TEST_GPU_LAYOUT); the scenarios, functions
sc_NAME, live in the scenarios_*.py modules by feature. Each asserts on its
own results (a failed assert exits non-zero with the traceback on stderr);
the pytest side checks exit codes and messages.

A batch runs several scenarios in one launch (a process start, a CUDA
context and an MPS client each cost seconds): SPECS_JSON is a list of
{"id", "name", "args", "env"}; each scenario gets the env set around it, its
own process group (a prefix of the launch's TCPStore), and reports on stdout
between "[scenario ID] begin" and "[scenario ID] ok" or "[scenario ID]
FAILED" (scenario_batch.py), so the test of each scenario fails by name. A
failed scenario aborts its group (on CUDA: the IPC engine's abort), so peers
waiting on this rank fail that scenario early and go on with the next."""
from __future__ import annotations

import torch
import torch.distributed as dist

import scenarios_allreduce
import scenarios_batching
import scenarios_collectives
import scenarios_cuda_faults
import scenarios_cuda_streams
import scenarios_faults
import scenarios_hierarchical
import scenarios_p2p
import scenarios_surface
import scenarios_training
import worker_context
from worker_context import ARGS, CUDA, RANK, SCENARIO, WORLD, base_store, cuda_backend

MODULES = [scenarios_allreduce, scenarios_batching, scenarios_collectives, scenarios_cuda_faults,
           scenarios_cuda_streams, scenarios_faults, scenarios_hierarchical, scenarios_p2p, scenarios_surface,
           scenarios_training]


def scenario(name: str):
    """The function sc_NAME of the one module that defines it."""
    found = [getattr(m, "sc_" + name) for m in MODULES if hasattr(m, "sc_" + name)]
    assert len(found) == 1, f"scenario {name!r} is defined in {len(found)} modules"
    return found[0]


def run_batch(specs: str):
    """The scenarios of `specs` in turn, one process group each (scenario_batch.py)."""
    from scenario_batch import run_batch as run

    def run_one(spec, prefix):
        worker_context.set_scenario(spec.get("args", []), prefix)
        scenario(spec["name"])()

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
