"""Argument normalization and the checks that run before any work.

Messages name the function, the argument, the index and both values, e.g.
"fastpar.scatter: chunk_sizes sums to 12 but tensor.size(0) is 10".
The C++ ops repeat the tensor-level checks (dtype, numel, contiguity, devices)
with the same wording, so torch.ops.fastpar.* called directly is just as safe.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
from torch.distributed import ReduceOp

_Tensor = torch.Tensor

# fastpar's reduce-op codes, the one table of them: the values of the C++
# ReduceOp (csrc/core/kernels/reduce_ops.h), which are torch's RedOpType
# values. The list ops (torch.ops.fastpar.*) take the arithmetic ones; the
# torch.distributed backend's direct calls (distributed/direct.py) take all.
REDUCE_OPS = {"SUM": 0, "AVG": 1, "PRODUCT": 2, "MIN": 3, "MAX": 4, "BAND": 5, "BOR": 6, "BXOR": 7}
_OPS = {name: code for name, code in REDUCE_OPS.items() if code <= REDUCE_OPS["MAX"]}
# The members as callers pass them (ReduceOp.SUM, ...), for identity tests:
# hashing or isinstance-testing a ReduceOp costs more than the rest of a small
# list op's Python side.
_MEMBERS = tuple((getattr(ReduceOp, name), code) for name, code in _OPS.items())


def op_value(fn: str, op: Any) -> int:
    """torch.distributed.ReduceOp (enum member or instance), its name, or its int."""
    for member, code in _MEMBERS:
        if op is member:
            return code
    if isinstance(op, ReduceOp):
        op = op.op if hasattr(op, "op") else op
    if isinstance(op, ReduceOp.RedOpType):
        name = op.name
        if name not in _OPS:
            raise ValueError(f"fastpar.{fn}: op is ReduceOp.{name}, which fastpar does not support "
                             f"(supported: {', '.join('ReduceOp.' + k for k in _OPS)})")
        return _OPS[name]
    if isinstance(op, str) and op.upper() in _OPS:
        return _OPS[op.upper()]
    if isinstance(op, int) and not isinstance(op, bool) and op in _OPS.values():
        return op
    raise ValueError(f"fastpar.{fn}: op is {op!r}, which is not one of "
                     f"{', '.join('ReduceOp.' + k for k in _OPS)}")


def tensor_list(fn: str, arg: str, ts: Any, allow_empty: bool = False) -> list:
    if isinstance(ts, torch.Tensor) or not isinstance(ts, (list, tuple)):
        raise TypeError(f"fastpar.{fn}: {arg} must be a list or tuple of tensors, got {type(ts).__name__}")
    ts = list(ts)
    if not ts and not allow_empty:
        raise ValueError(f"fastpar.{fn}: expected a non-empty list of tensors for argument '{arg}', "
                         f"got an empty list")
    for t in ts:  # no enumerate on the common path: the index is found only to name it
        if not isinstance(t, _Tensor):
            i = next(i for i, t in enumerate(ts) if not isinstance(t, _Tensor))
            raise TypeError(f"fastpar.{fn}: {arg}[{i}] must be a Tensor, got {type(ts[i]).__name__}")
    return ts


def device(fn: str, name: str, d: Any) -> torch.device:
    """torch.cuda.comm convention: an int is a CUDA device index, -1 the CPU."""
    if isinstance(d, torch.device):
        return d
    if isinstance(d, int) and not isinstance(d, bool):
        return torch.device("cpu") if d == -1 else torch.device("cuda", d)
    if isinstance(d, str):
        try:
            dev = torch.device(d)
        except RuntimeError as e:
            raise ValueError(f"fastpar.{fn}: {name} is {d!r}, not a device: {e}") from None
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        return dev
    raise TypeError(f"fastpar.{fn}: {name} is {d!r} ({type(d).__name__}); expected a torch.device, "
                    f"a device string such as 'cpu' or 'cuda:1', or a CUDA device index")


def device_list(fn: str, devices: Any) -> list:
    if devices is None or isinstance(devices, (str, int, torch.device)):
        raise TypeError(f"fastpar.{fn}: devices must be a list of devices, got {devices!r}")
    devs = [device(fn, f"devices[{i}]", d) for i, d in enumerate(devices)]
    if not devs:
        raise ValueError(f"fastpar.{fn}: expected a non-empty list for argument 'devices', got an empty list")
    kinds = {d.type for d in devs}
    if len(kinds) > 1:
        first = devs[0]
        i = next(i for i, d in enumerate(devs) if d.type != first.type)
        raise ValueError(f"fastpar.{fn}: devices[{i}] is '{devs[i]}' but devices[0] is '{first}'; "
                         f"all devices must be CPU or all CUDA")
    # A device may repeat, CUDA ones included: every list entry is its own
    # buffer, so e.g. scatter(x, ["cuda:0", "cuda:0"]) gives two chunks on cuda:0.
    return devs


def dim_index(fn: str, dim: int, ndim: int, what: str = "tensor") -> int:
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"fastpar.{fn}: dim must be an int, got {dim!r}")
    lo, hi = -max(ndim, 1), max(ndim, 1) - 1
    if not lo <= dim <= hi:
        raise IndexError(f"fastpar.{fn}: dim is {dim} but {what} has {ndim} dimensions "
                         f"(valid: {lo}..{hi})")
    return dim % max(ndim, 1)


def root_index(fn: str, root: int, n: int, arg: str) -> int:
    if not isinstance(root, int) or isinstance(root, bool):
        raise TypeError(f"fastpar.{fn}: root must be an int, got {root!r}")
    if not 0 <= root < n:
        raise ValueError(f"fastpar.{fn}: root is {root} but {arg} has {n} tensors (valid: 0..{n - 1})")
    return root


def same_length(fn: str, arg: str, got: Sequence, ref_arg: str, ref: Sequence) -> None:
    if len(got) != len(ref):
        raise ValueError(f"fastpar.{fn}: {arg} has {len(got)} tensors but {ref_arg} has {len(ref)}")
