"""Direct calls: collectives on a fastpar group without torch.distributed's per-call path.

    import fastpar.distributed as fd
    fd.all_reduce(t)                       # = dist.all_reduce(t) on a fastpar group, synchronous
    fd.broadcast(t, src=0)
    fd.all_gather_into_tensor(out, t)

A 4 KiB dist.all_reduce spends most of its time in torch.distributed itself
(the Python wrapper, the op dispatcher, a Work object: benchmarks/bench_latency.py
breaks it down); fastpar's transport is a fraction of a microsecond. These
functions call the fastpar backend object of the group directly: same
arguments (less async_op), same checks and error messages, same results, in
place and synchronous. For code that issues one small collective per layer,
such as CPU tensor-parallel inference (examples/tensor_parallel_inference.py).

The group must be a fastpar group ("fastpar" or "cpu:fastpar,..."); any other
raises TypeError. CUDA tensors go to the group's fastpar CUDA backend and, as
dist.all_reduce(...).wait() does, order the current stream after the call.
"""
from __future__ import annotations

import weakref

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from .._args import REDUCE_OPS
from .backend import get_fastpar_backend

_OPS = {getattr(ReduceOp, name): code for name, code in REDUCE_OPS.items()}
_SUM = ReduceOp.SUM
_NON_MEMBER = dist.GroupMember.NON_GROUP_MEMBER
# The default group, as torch.distributed's public API names it (a class
# property: it follows init / destroy_process_group).
_group = dist.group

# (weak reference to the group object, its fastpar backend) of the last call:
# one identity test per call instead of a backend lookup. Weak, so the
# cache never keeps a destroyed group alive: a group kept alive past
# destroy_process_group keeps its TCPStore server alive too, and the next
# init_process_group on the same port then reuses that server, old keys
# included (torch shares one server per port in a process); and the backend,
# which holds the group's shared memory, is dropped with the group.
def _dead_ref():
    return None


_last: list = [_dead_ref, None]


def _forget(ref) -> None:
    if _last[0] is ref:
        _last[0], _last[1] = _dead_ref, None


def _backend(group):
    pg = _group.WORLD if group is None else group
    if pg is not None and _last[0]() is pg:
        return _last[1]
    if pg is None:
        raise RuntimeError("fastpar.distributed: no default process group; call "
                           "dist.init_process_group('fastpar') first")
    backend = get_fastpar_backend(pg)
    _last[0], _last[1] = weakref.ref(pg, _forget), backend
    return backend


def _op_value(op) -> int:
    # `is` first: hashing a ReduceOp costs more than the rest of the Python side
    if op is _SUM:
        return 0
    try:
        return _OPS[op]
    except (KeyError, TypeError):
        raise ValueError(f"fastpar.all_reduce: op {op!r} is not supported "
                         "(supported: SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR)") from None


def all_reduce(tensor: torch.Tensor, op=ReduceOp.SUM, group=None) -> None:
    """dist.all_reduce(tensor, op, group), in place and synchronous, on a fastpar group."""
    if group is _NON_MEMBER:
        return
    _backend(group)._direct_all_reduce(tensor, _op_value(op))


def broadcast(tensor: torch.Tensor, src: int = 0, group=None) -> None:
    """dist.broadcast(tensor, src, group): `src` is a global rank, as in torch."""
    if group is _NON_MEMBER:
        return
    root = src if group is None else dist.get_group_rank(group, src)
    _backend(group)._direct_broadcast(tensor, root)


def all_gather_into_tensor(output_tensor: torch.Tensor, input_tensor: torch.Tensor, group=None) -> None:
    """dist.all_gather_into_tensor(output_tensor, input_tensor, group), synchronous."""
    if group is _NON_MEMBER:
        return
    _backend(group)._direct_all_gather_into_tensor(output_tensor, input_tensor)
