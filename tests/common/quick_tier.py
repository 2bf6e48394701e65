"""The quick tier (`bash tests/run.sh --quick`): the one table of the tests
that touch every feature once, each with what it touches. conftest.py marks
the tests this table selects `quick`; tests/tooling/test_quick_tier.py checks
that the table covers every collective of the torch.distributed front
(csrc/torch/distributed/backend.h) on each engine and every list op
(fastpar/comm.py), and conftest.py fails a run whose table names a test that
does not exist.

An entry is a test file ("wrappers/test_data_parallel.py"), a test function
with every parametrization ("c10d/test_surface.py::test_surface") or one
parametrization ("c10d/test_surface.py::test_surface[cpu-2]"), relative to
tests/. Multi-process tests run in
batches per (device, layout, world) shape (batched_scenarios.py), so one
shape (cpu-2) of each batched test costs one launch for all of them; the CUDA
shapes skip without a GPU, and run on a GPU machine.

What it leaves to the full run (tests/run.sh): the sanitizer builds of the
core and of the host emulation, the torch 2.11 header compile, the client
programs (tests/clients), the namespace hosts (tests/multihost), the soaks,
and the other parametrizations."""
from __future__ import annotations

import ast
import os
import re
from typing import Dict, FrozenSet, Iterable, List

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TESTS)

# Where collectives run: the CPU shared-memory engine, the hierarchical
# engine (fake hosts on one machine: shared memory inside, gloo between), the
# CUDA engine (CUDA IPC, NCCL as its fallback), and the list ops of one
# process on CPU and on CUDA tensors.
ENGINES = ("shm", "hierarchical", "cuda")
LIST_OPS = ("list-cpu", "list-cuda")

# The methods of the front (backend.h) that are no collective call: names,
# options, timeouts, counters, teardown and the coalescing brackets (whose
# calls are the collectives inside them).
NOT_COLLECTIVES = frozenset({
    "getBackendName", "getBackendOptions", "setTimeout", "getSequenceNumberForGroup", "setSequenceNumberForGroup",
    "abort", "shutdown", "supportsCoalescing", "startCoalescing", "endCoalescing"})


def front_methods() -> FrozenSet[str]:
    """Every c10d::Backend method the front (fastpar._C.Backend) overrides, as
    tests/c10d/test_c10d_methods.py reads them."""
    with open(os.path.join(ROOT, "csrc", "torch", "distributed", "backend.h")) as f:
        code = "".join(line for line in f if not line.lstrip().startswith(("#", "//")))
    return frozenset(re.findall(r"(?<!~)\b(\w+)\([^;{]*\)\s*(?:const\s*)?override", code))


def collectives() -> FrozenSet[str]:
    """The collective calls of the torch.distributed front."""
    return front_methods() - NOT_COLLECTIVES


def list_ops() -> FrozenSet[str]:
    """The public functions of fastpar/comm.py (the list ops; aliases such as
    all_reduce are the same functions)."""
    with open(os.path.join(ROOT, "fastpar", "comm.py")) as f:
        tree = ast.parse(f.read())
    return frozenset(n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_"))


# The features besides the collectives and list ops that the quick tier
# touches once each.
FEATURES = ("bad input refused", "DataParallel", "DistributedDataParallel", "stock DDP", "training helpers",
            "dead peer", "absent peer", "mismatched calls", "crash during init", "fork", "/dev/shm limits",
            "segment names", "direct calls", "registered buffers", "placement", "topology",
            "autoload", "CPU ISAs", "random call sequence", "Work reuse", "c10d method table",
            "CUDA engine plumbing", "tooling")

# What no test of the whole suite runs yet, so the quick tier cannot touch it
# either: named here so the gap stays in sight (test_quick_tier.py fails once
# the table covers a name listed here, or a name is in neither).
UNTESTED: Dict[str, Dict[str, str]] = {
    "list-cpu": {"reduce_add_coalesced": "tested on CUDA tensors only (list_ops/test_cuda.py)"},
    "cuda": {"allreduce_sparse": "tested on CPU tensors only (c10d/test_surface.py)"},
    "hierarchical": {"recvAnysource": "no test runs it across hosts"},
    "list-cuda": {name: "tested on CPU tensors; on CUDA tensors only the ops it is made of" for name in
                  ("allreduce_coalesced", "broadcast_coalesced")},
}

SHM_CLASSIC = {"allreduce", "broadcast", "reduce", "allgather", "_allgather_base", "gather", "scatter",
               "reduce_scatter", "_reduce_scatter_base", "alltoall", "alltoall_base", "barrier"}
SURFACE = {"allgather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced", "allreduce_coalesced",
           "allgather_coalesced", "gather_into_tensor", "allreduce_sparse", "monitoredBarrier", "send", "recv",
           "_allgather_base", "_reduce_scatter_base", "allreduce", "barrier"}

# entry -> what it touches: {engine or list-op family: the names of
# collectives() or list_ops() it runs}, and/or "features": the other features it is the quick check of.
QUICK: Dict[str, dict] = {
    # --- the torch.distributed front, CPU tensors on one host: the shared-memory engine
    "c10d/test_collectives.py::test_all_reduce_every_op_dtype_and_size[cpu-2]": {"shm": {"allreduce"}},
    "c10d/test_collectives.py::test_every_collective_every_dtype_and_op[cpu-2]": {"shm": SHM_CLASSIC},
    "c10d/test_collectives.py::test_registered_buffers_all_reduce_without_copy_in[cpu-2]": {
        "shm": {"allreduce"}, "features": ["registered buffers"]},
    "c10d/test_collectives.py::test_bad_input_is_refused_before_any_work": {"features": ["bad input refused"]},
    "c10d/test_surface.py::test_surface[cpu-2]": {"shm": SURFACE},
    "c10d/test_p2p.py::test_p2p_against_sent_values[cpu-2]": {"shm": {"send", "recv", "recvAnysource"}},
    "c10d/test_placement.py::test_near_far_and_measured_give_the_same_bits[cpu-2]": {"features": ["placement"]},
    "c10d/test_topology.py::test_read_two_sockets": {"features": ["topology"]},
    "c10d/test_topology.py::test_place_spread_two_sockets": {"features": ["topology"]},
    "c10d/test_work_reuse.py": {"features": ["Work reuse"]},
    "c10d/test_c10d_methods.py": {"features": ["c10d method table"]},
    "c10d/test_coalesced_checks.py": {"features": ["bad input refused"]},
    "c10d/test_autoload.py::test_one_rank_without_importing_fastpar": {"features": ["autoload"]},
    # --- several (fake) hosts: the hierarchical engine
    "c10d/test_hierarchical.py::test_hierarchical_two_hosts_of_two": {"hierarchical": SHM_CLASSIC - {"alltoall_base"}},
    "c10d/test_hierarchical.py::test_every_dtype_crosses_between_hosts": {
        "hierarchical": {"alltoall_base", "send", "recv", "broadcast", "allgather", "gather", "scatter", "reduce",
                         "reduce_scatter", "barrier"}},
    "c10d/test_surface.py::test_surface_across_fake_hosts": {"hierarchical": SURFACE},
    "c10d/test_random_sequences.py::test_random_sequence[3-hosts-AAB-leaders-seed5]": {
        "hierarchical": {"allreduce_coalesced"}, "features": ["random call sequence", "direct calls"]},
    # --- CUDA tensors: the CUDA engine (these shapes skip without a GPU) and its plumbing (runs anywhere)
    "c10d/test_collectives.py::test_all_reduce_every_op_dtype_and_size[cuda-shared-2]": {"cuda": {"allreduce"}},
    "c10d/test_collectives.py::test_every_collective_every_dtype_and_op[cuda-shared-2]": {"cuda": SHM_CLASSIC},
    "c10d/test_surface.py::test_surface[cuda-2]": {"cuda": SURFACE - {"allreduce_sparse"}},
    "c10d/test_p2p.py::test_p2p_against_sent_values[cuda-shared-2]": {"cuda": {"send", "recv", "recvAnysource"}},
    "c10d/test_cuda_backend_plumbing.py": {"features": ["CUDA engine plumbing"]},
    # --- list ops, one process
    "list_ops/test_reduce_ops_cpu.py": {"list-cpu": {"allreduce", "allreduce_coalesced", "reduce", "reduce_add",
                                                     "reduce_scatter"}},
    "list_ops/test_copy_ops_cpu.py": {"list-cpu": {"broadcast", "broadcast_coalesced", "scatter", "gather",
                                                   "allgather"}},
    "list_ops/test_cuda.py::test_allreduce_exact[n2-float32-AVG-size1000-ring-offset0]": {"list-cuda": {"allreduce"}},
    "list_ops/test_cuda.py::test_reduce[n2-float32-AVG-size1000-offset0-separate_elsewhere]": {
        "list-cuda": {"reduce"}},
    "list_ops/test_cuda.py::test_reduce_scatter[n2-float32-AVG-size1000-offset0-in_placeFalse]": {
        "list-cuda": {"reduce_scatter"}},
    "list_ops/test_cuda.py::test_allgather[n2-float32-size1000-offset1-in_placeFalse]": {"list-cuda": {"allgather"}},
    "list_ops/test_cuda.py::test_broadcast[float32-size1000-cuda_in_place-offset0]": {"list-cuda": {"broadcast"}},
    "list_ops/test_cuda.py::test_copy_many_scatter_and_gather[1-dtype0]": {"list-cuda": {"scatter", "gather"}},
    "list_ops/test_cuda.py::test_reduce_add_to_the_cpu_as_torch_cuda_comm": {
        "list-cuda": {"reduce_add", "reduce_add_coalesced"}},
    "list_ops/test_cuda.py::test_cpu_ops_unchanged_in_any_build": {"features": ["bad input refused"]},
    "list_ops/test_cuda.py::test_built_with_cuda_matches_registered_kernels": {"features": ["tooling"]},
    "list_ops/test_cuda.py::test_overlapping_written_entries_are_refused_without_a_gpu": {
        "features": ["bad input refused"]},
    "list_ops/test_cuda.py::test_errors_match_cpu_backend": {"features": ["bad input refused"]},
    "list_ops/test_cpu_isa.py::test_every_isa_gives_the_same_bits_and_torchs_reference": {
        "features": ["CPU ISAs"]},
    "faults/test_errors.py": {"features": ["bad input refused"]},
    # --- the wrappers
    "wrappers/test_data_parallel.py": {"features": ["DataParallel"]},
    **{f"wrappers/test_ddp.py::{name}[world2-fastpar{case}]": {"features": ["DistributedDataParallel"]} for name, case in [
        ("test_matches_single_process_on_the_global_batch", "-fastpar"),
        ("test_matches_single_process_on_the_global_batch", "-no_sync"),
        ("test_matches_single_process_on_the_global_batch", "-comm_hook"),
        ("test_every_rank_holds_identical_bits", "-fastpar_bucket_view"),
        ("test_buckets_live_in_registered_memory_exactly_on_the_fastpar_backend", ""),
        ("test_find_unused_parameters_averages_what_some_rank_used", "")]},
    "wrappers/test_stock_ddp.py::test_stock_ddp_matches_a_reference[cpu-2]": {"features": ["stock DDP"]},
    "wrappers/test_training_support.py": {"features": ["training helpers"]},
    "wrappers/test_datasets.py": {"features": ["training helpers"]},
    # --- the fast fault cases
    "faults/test_faults.py::test_peer_never_calls_the_collective": {"features": ["absent peer"]},
    "faults/test_faults.py::test_sigkill_mid_collective[1]": {"features": ["dead peer"]},
    "faults/test_faults.py::test_mismatched_calls": {"features": ["mismatched calls"]},
    "faults/test_faults.py::test_segment_names_from_the_store_are_checked": {"features": ["segment names"]},
    "faults/test_init_crash.py::test_signal_during_init[SIGKILL-published-1]": {"features": ["crash during init"]},
    "faults/test_fork.py::test_child_destroys_inherited_group[collective-rank0]": {"features": ["fork"]},
    "faults/test_shm_limits.py::test_init_fails_clearly_when_dev_shm_is_too_small": {"features": ["/dev/shm limits"]},
    # --- tooling
    "tooling/test_quick_tier.py": {"features": ["tooling"]},
    "tooling/test_doc_paths.py": {"features": ["tooling"]},
    "tooling/test_layers.py": {"features": ["tooling"]},
    "tooling/test_covering.py": {"features": ["tooling"]},
    "tooling/test_readme_table.py": {"features": ["tooling"]},
}


def test_id(path: str, name: str) -> str:
    """A collected test's id as the table writes it: its file relative to
    tests/, '::', its name with parameters."""
    return os.path.relpath(path, TESTS).replace(os.sep, "/") + "::" + name


def _matches(entry: str, tid: str) -> bool:
    if "::" not in entry:
        return tid.startswith(entry + "::")
    return tid == entry or tid.startswith(entry + "[")


def selects(tid: str) -> bool:
    """Whether the quick tier runs the test `tid` (test_id's form)."""
    return any(_matches(entry, tid) for entry in QUICK)


def stale_entries(tids: Iterable[str], whole: List[str]) -> List[str]:
    """The table's entries whose file does not exist, or whose file lies under
    a path of `whole` (collected whole) and has no test of the entry's
    function among `tids` (a parametrization may exist only on some machines:
    the CUDA devices of a test)."""
    tids = list(tids)
    whole = [os.path.abspath(p) for p in whole]
    out = []
    for entry in QUICK:
        path = os.path.join(TESTS, entry.split("::")[0])
        if not os.path.isfile(path):
            out.append(f"{entry} (no file tests/{entry.split('::')[0]})")
        elif any(path == w or path.startswith(w.rstrip(os.sep) + os.sep) for w in whole) \
                and not any(_matches(entry.split("[")[0], t) for t in tids):
            out.append(entry)
    return out


def covered(family: str) -> FrozenSet[str]:
    """The names the table's entries touch on `family` (an engine or a list-op
    family)."""
    return frozenset(name for touches in QUICK.values() for name in touches.get(family, ()))
