"""fastpar._C.CudaEngine without a GPU: construction, its knobs from the
environment, its state before setup, the front's refusal of bad calls before
any engine runs, and the forwarding of the other calls to its fallback backend,
with a one-rank gloo group standing in for NCCL (the class itself never
touches the GPU until the first CUDA collective). The CUDA paths:
test_collectives.py, test_cuda_ipc.py (their CUDA shapes need a GPU)."""
import datetime
import os

import pytest
import torch
import torch.distributed as dist

import fastpar

pytestmark = pytest.mark.skipif(not fastpar._C.built_with_cuda, reason="CudaEngine exists in CUDA builds only")


def make(size=1):
    """Rank 0 of `size`; with more than one rank the engine is never set up
    (its fallback is a 1-rank gloo group), but what depends on the rank
    count (the one-shot limit) is its own."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = dist.HashStore()
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), 0, 1, datetime.timedelta(seconds=10))
    return fastpar._C.CudaEngine(store, 0, size, 10_000, gloo)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for k in ("FASTPAR_CUDA_IPC_MAX_BYTES", "FASTPAR_CUDA_IPC_SLOT_BYTES", "FASTPAR_BLOCKING_WAIT",
              "FASTPAR_CUDA_IPC_TWO_SHOT", "FASTPAR_CUDA_IPC_COLLECTIVES", "FASTPAR_CUDA_IPC_ONE_SHOT_MAX_BYTES",
              "FASTPAR_CUDA_IPC_FLAGS"):
        monkeypatch.delenv(k, raising=False)


def test_defaults_and_state():
    cb = make()
    assert cb.ipc_state == "not set up"
    assert cb.shares_gpu is False and cb.mps == "" and cb.dead_peer == -1
    assert cb.max_ipc_bytes == 8 << 20
    assert cb.blocking_wait is False
    assert cb.ipc_two_shot == "steps"
    assert isinstance(cb.fallback, dist.ProcessGroupGloo)
    assert cb.ipc_calls == 0 and cb.fallback_calls == 0 and cb.direct_calls == 0


def test_knobs_from_the_environment(monkeypatch):
    monkeypatch.setenv("FASTPAR_CUDA_IPC_MAX_BYTES", "0")
    monkeypatch.setenv("FASTPAR_BLOCKING_WAIT", "1")
    monkeypatch.setenv("FASTPAR_CUDA_IPC_TWO_SHOT", "fused")
    monkeypatch.setenv("FASTPAR_CUDA_IPC_COLLECTIVES", "fused")
    monkeypatch.setenv("FASTPAR_CUDA_IPC_ONE_SHOT_MAX_BYTES", "65536")
    cb = make()
    assert cb.max_ipc_bytes == 0 and cb.blocking_wait is True
    assert cb.ipc_two_shot == "fused" and cb.ipc_collectives == "fused"
    assert cb.one_shot_max_bytes == 65536


def test_one_shot_limit_defaults_by_rank_count_and_the_test_hook_overrides_it():
    cb = make()
    assert cb.one_shot_max_bytes == 2 << 20  # 1 rank: the 2-rank default
    assert make(3).one_shot_max_bytes == 512 << 10 and make(8).one_shot_max_bytes == 256 << 10
    override = fastpar._C._testing.cuda_override
    override(cb, "FASTPAR_CUDA_IPC_ONE_SHOT_MAX_BYTES", "4096")
    assert cb.one_shot_max_bytes == 4096
    with pytest.raises(ValueError, match="FASTPAR_CUDA_IPC_ONE_SHOT_MAX_BYTES is '-5' but must be a byte count >= 0"):
        override(cb, "FASTPAR_CUDA_IPC_ONE_SHOT_MAX_BYTES", "-5")
    assert cb.one_shot_max_bytes == 4096
    override(cb, "FASTPAR_CUDA_IPC_ONE_SHOT_MAX_BYTES", "")
    assert cb.one_shot_max_bytes == 2 << 20


def test_fused_forms_default_to_steps_and_the_test_hook_flips_them():
    cb = make()
    override = fastpar._C._testing.cuda_override
    assert cb.ipc_two_shot == "steps" and cb.ipc_collectives == "steps"
    override(cb, "FASTPAR_CUDA_IPC_COLLECTIVES", "fused")
    assert cb.ipc_collectives == "fused" and cb.ipc_two_shot == "steps"
    with pytest.raises(ValueError, match="FASTPAR_CUDA_IPC_COLLECTIVES is 'fast' but must be 'fused' or 'steps'"):
        override(cb, "FASTPAR_CUDA_IPC_COLLECTIVES", "fast")
    assert cb.ipc_collectives == "fused"
    override(cb, "FASTPAR_CUDA_IPC_TWO_SHOT", "fused")
    assert cb.ipc_two_shot == "fused"
    override(cb, "FASTPAR_CUDA_IPC_TWO_SHOT", "")
    assert cb.ipc_two_shot == "steps"
    with pytest.raises(ValueError, match="the knob is 'FASTPAR_CUDA_IPC_BARRIER' but must be FASTPAR_CUDA_IPC_TWO_SHOT"):
        override(cb, "FASTPAR_CUDA_IPC_BARRIER", "per_peer")


def test_flag_form_defaults_to_peer_and_only_the_test_hook_flips_it(monkeypatch):
    """The one-kernel calls' block barriers: each waiter polls the peer's flag
    (the default), or each rank writes its arrival into the waiter's memory,
    the measured alternative that no environment variable selects."""
    monkeypatch.setenv("FASTPAR_CUDA_IPC_FLAGS", "waiter")
    cb = make()
    override = fastpar._C._testing.cuda_override
    assert cb.ipc_flags == "peer"
    override(cb, "FASTPAR_CUDA_IPC_FLAGS", "waiter")
    assert cb.ipc_flags == "waiter" and cb.ipc_two_shot == "steps" and cb.ipc_collectives == "steps"
    with pytest.raises(ValueError, match="FASTPAR_CUDA_IPC_FLAGS is 'remote' but must be 'waiter' or 'peer'"):
        override(cb, "FASTPAR_CUDA_IPC_FLAGS", "remote")
    assert cb.ipc_flags == "waiter"
    override(cb, "FASTPAR_CUDA_IPC_FLAGS", "")
    assert cb.ipc_flags == "peer"
    with pytest.raises(ValueError, match="_ONE_SHOT_MAX_BYTES or FASTPAR_CUDA_IPC_FLAGS"):
        override(cb, "FASTPAR_CUDA_IPC_BARRIER", "per_peer")


@pytest.mark.parametrize("name,value,words", [
    ("FASTPAR_CUDA_IPC_MAX_BYTES", "8M", "FASTPAR_CUDA_IPC_MAX_BYTES is '8M' but must be a byte count"),
    ("FASTPAR_CUDA_IPC_MAX_BYTES", "-1", "FASTPAR_CUDA_IPC_MAX_BYTES is '-1'"),
    ("FASTPAR_CUDA_IPC_SLOT_BYTES", "100", "FASTPAR_CUDA_IPC_SLOT_BYTES is '100' but must be a byte count (decimal digits) >= 4096"),
    ("FASTPAR_BLOCKING_WAIT", "yes", "FASTPAR_BLOCKING_WAIT is 'yes' but must be 0 or 1"),
    ("FASTPAR_CUDA_IPC_TWO_SHOT", "fast", "FASTPAR_CUDA_IPC_TWO_SHOT is 'fast' but must be 'fused' or 'steps'"),
    ("FASTPAR_CUDA_IPC_COLLECTIVES", "1", "FASTPAR_CUDA_IPC_COLLECTIVES is '1' but must be 'fused' or 'steps'"),
    ("FASTPAR_CUDA_IPC_ONE_SHOT_MAX_BYTES", "-1", "FASTPAR_CUDA_IPC_ONE_SHOT_MAX_BYTES is '-1' but must be a byte count"),
])
def test_bad_knobs_are_refused_by_name(monkeypatch, name, value, words):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        make()


def test_fallback_is_required():
    with pytest.raises((TypeError, ValueError)):
        fastpar._C.CudaEngine(dist.HashStore(), 0, 1, 1000, None)


def test_calls_without_ipc_schedule_go_to_the_fallback():
    cb = make()
    opts = dist.BarrierOptions()
    opts.device_ids = [0]  # a barrier naming a CUDA device reaches the CUDA engine
    front(cb).barrier(opts).wait()
    assert cb.ipc_state == "not set up"  # only a CUDA collective with an IPC schedule sets IPC up
    assert cb.ipc_calls == 0


def front(cb):
    """fastpar's one backend over a one-rank group, with `cb` as its CUDA engine."""
    shm = fastpar._C.ShmEngine(dist.HashStore(), 0, 1, [0], 10_000)
    return fastpar._C.Backend(0, 1, 10_000, shm, cuda=cb)


META = torch.empty(3, device="meta")


@pytest.mark.parametrize("call,words", [
    (lambda b: b.broadcast([META]),
     r"fastpar.broadcast: tensors\[0\] is on device 'meta' but the fastpar backend handles CPU and CUDA tensors only"),
    (lambda b: b.allreduce([META]), r"fastpar.all_reduce: tensors\[0\] is on device 'meta'"),
    (lambda b: b.allgather([[torch.zeros(3)]], [META]), r"fastpar.all_gather: input_tensors\[0\] is on device 'meta'"),
    (lambda b: b._allgather_base(torch.zeros(3), META),
     r"fastpar.all_gather_into_tensor: input_tensor is on device 'meta'"),
    (lambda b: b.reduce_scatter([META], [[torch.ones(3)]]), r"fastpar.reduce_scatter: output is on device 'meta'"),
    (lambda b: b.alltoall_base(META, torch.ones(3), [], [], dist.AllToAllOptions()),
     r"fastpar.all_to_all_single: output is on device 'meta'"),
    (lambda b: b.alltoall([torch.zeros(3), torch.zeros(3)], [torch.ones(3)], dist.AllToAllOptions()),
     r"fastpar.all_to_all: output_tensor_list has 2 tensors but the group has 1 ranks"),
    (lambda b: b.allgather_coalesced([], [torch.ones(3)]),
     r"fastpar.all_gather_coalesced: output_tensor_lists has 0 lists but the group has 1 ranks"),
    (lambda b: b.broadcast([torch.ones(3), torch.ones(3)]),
     r"fastpar.broadcast: expected exactly one tensor in tensors \(one per process\), got 2"),
    (lambda b: b.allgather([[torch.zeros(3)]], [torch.ones(3), torch.ones(3)]),
     r"fastpar.all_gather: expected exactly one tensor in input_tensors \(one per process\), got 2"),
])
def test_bad_calls_are_refused_before_any_engine_runs(call, words):
    cb = make()
    with pytest.raises(ValueError, match=words):
        call(front(cb))
    assert cb.ipc_state == "not set up" and cb.ipc_calls == 0 and cb.fallback_calls == 0


def test_abort_before_setup_is_harmless():
    cb = make()
    cb.abort()
    assert cb.ipc_state == "not set up"


@pytest.mark.skipif(not dist.is_nccl_available(), reason="torch without NCCL")
def test_each_nccl_group_gets_its_own_options_with_the_users_settings():
    from fastpar.distributed.backend import _nccl_options
    user = dist.ProcessGroupNCCL.Options()
    user.is_high_priority_stream = True
    user.config.max_ctas = 7
    timeout = datetime.timedelta(seconds=42)
    world = _nccl_options(timeout, [0, 1, 2, 3], user, "world")
    leaders = _nccl_options(timeout, [0, 2], user, "leaders")
    assert world is not user and leaders is not world
    # The first group's options keep its own ranks and name after the second is made.
    assert world.global_ranks_in_group == [0, 1, 2, 3] and world.group_name == "world"
    assert leaders.global_ranks_in_group == [0, 2] and leaders.group_name == "leaders"
    for o in (world, leaders):
        assert o.is_high_priority_stream is True and o.config.max_ctas == 7 and o._timeout == timeout
    assert user.global_ranks_in_group == [] and user.group_name == ""  # the user's object is left as it was
    plain = _nccl_options(timeout, [0], None)
    assert plain.is_high_priority_stream is False and plain.global_ranks_in_group == [0]
