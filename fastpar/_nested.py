"""Scatter and gather of nested arguments (tuples, lists, dicts of tensors),
with autograd, for fastpar.DataParallel.

Differences from torch.nn.parallel.scatter_gather, on purpose:
* every batched tensor must have the same size along ``dim`` (checked up
  front, naming the argument path), and the split is balanced (10 samples on 4
  devices -> 3, 3, 2, 2 rather than torch.chunk's 3, 3, 3, 1);
* 0-dim tensors are not batched: each replica gets a copy;
* 0-dim outputs (a loss computed inside forward) are combined by a weighted
  mean over chunk sizes by default, so an uneven split gives the loss of the
  whole batch.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch

from . import comm

SCALAR_GATHER_MODES = ("weighted_mean", "sum", "stack")


def balanced_chunk_sizes(batch: int, max_chunks: int) -> List[int]:
    """Sizes of at most ``max_chunks`` non-empty chunks, differing by at most one.
    A batch of zero samples gets one empty chunk (the module still runs once)."""
    n = max(1, min(max_chunks, batch))
    return [batch // n + (1 if i < batch % n else 0) for i in range(n)]


def batch_size(args: Any, dim: int, root: str = "inputs") -> Optional[int]:
    """The common size along ``dim`` of every batched (non-0-dim) tensor in
    ``args``; None when there is none. Raises on the first disagreement."""
    found: List[Tuple[str, int]] = []

    def visit(obj: Any, path: str) -> None:
        if isinstance(obj, torch.Tensor):
            if obj.dim() == 0:
                return
            if dim >= obj.dim():
                raise ValueError(f"fastpar.DataParallel: {path} has shape {list(obj.shape)}, which has no "
                                 f"dim {dim} to scatter along")
            size = obj.size(dim)
            if found and size != found[0][1]:
                raise ValueError(f"fastpar.DataParallel: {path} has size {size} along dim {dim} but "
                                 f"{found[0][0]} has size {found[0][1]}; every batched tensor must have "
                                 f"the same batch size")
            found.append((path, size))
        elif isinstance(obj, (list, tuple)):
            for i, x in enumerate(obj):
                visit(x, f"{path}[{i}]")
        elif isinstance(obj, dict):
            for k, x in obj.items():
                visit(x, f"{path}[{k!r}]")

    visit(args, root)
    return found[0][1] if found else None


class _Scatter(torch.autograd.Function):
    """fastpar.scatter forward; the backward gathers the chunk gradients back."""

    @staticmethod
    def forward(ctx, devices, chunk_sizes, dim, tensor):
        ctx.dim, ctx.source = dim, tensor.device
        return comm.scatter(tensor, devices, chunk_sizes, dim)

    @staticmethod
    def backward(ctx, *grads):
        return None, None, None, comm.gather([g.contiguous() for g in grads], ctx.dim, ctx.source)


class _Gather(torch.autograd.Function):
    """fastpar.gather forward; the backward scatters the gradient back to each replica's device."""

    @staticmethod
    def forward(ctx, destination, dim, *tensors):
        ctx.dim = dim
        ctx.devices = [t.device for t in tensors]
        ctx.sizes = [t.size(dim) for t in tensors]
        return comm.gather([t.contiguous() for t in tensors], dim, destination)

    @staticmethod
    def backward(ctx, grad):
        return (None, None) + tuple(comm.scatter(grad.contiguous(), ctx.devices, ctx.sizes, ctx.dim))


def _scatter_tensor(t: torch.Tensor, devices: Sequence[torch.device], sizes: List[int], dim: int) -> tuple:
    if t.dim() == 0:
        return tuple(t.to(d) for d in devices)  # .to is autograd-aware and a no-op on the same device
    if t.requires_grad and torch.is_grad_enabled():
        return _Scatter.apply(list(devices), sizes, dim, t)
    return comm.scatter(t.contiguous(), devices, sizes, dim)


def scatter_nested(obj: Any, devices: Sequence[torch.device], sizes: List[int], dim: int) -> list:
    """One copy of ``obj`` per device, tensors split by ``sizes`` along ``dim``;
    non-tensor leaves are shared by reference (as in nn.DataParallel)."""
    n = len(devices)
    if isinstance(obj, torch.Tensor):
        return list(_scatter_tensor(obj, devices, sizes, dim))
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return [type(obj)(*parts) for parts in zip(*(scatter_nested(x, devices, sizes, dim) for x in obj))]
    if isinstance(obj, (list, tuple)):
        if not obj:
            return [type(obj)() for _ in range(n)]
        return [type(obj)(parts) for parts in zip(*(scatter_nested(x, devices, sizes, dim) for x in obj))]
    if isinstance(obj, dict):
        if not obj:
            return [type(obj)() for _ in range(n)]
        keys = list(obj)
        cols = [scatter_nested(obj[k], devices, sizes, dim) for k in keys]
        return [type(obj)(zip(keys, parts)) for parts in zip(*cols)]
    return [obj] * n


def _gather_scalars(ts: Sequence[torch.Tensor], sizes: List[int], destination: torch.device,
                    mode: str) -> torch.Tensor:
    moved = torch.stack([t.to(destination) for t in ts])
    if mode == "stack":
        return moved
    if mode == "sum":
        return moved.sum()
    if not moved.is_floating_point():
        raise TypeError(f"fastpar.DataParallel: the replicas returned 0-dim tensors of dtype {moved.dtype}; "
                        f"scalar_gather='weighted_mean' needs floating point (use 'sum' or 'stack')")
    # Each replica's scalar is taken as a mean over its chunk: weighting by chunk
    # size makes the result the mean over the whole batch, whatever the split.
    w = torch.tensor(sizes, dtype=moved.dtype, device=destination) / float(sum(sizes) or 1)
    return (moved * w).sum()


def gather_nested(outputs: Sequence[Any], sizes: List[int], destination: torch.device, dim: int,
                  scalar_mode: str, path: str = "output") -> Any:
    """Combine per-replica outputs of one structure into one, on ``destination``."""
    first = outputs[0]
    for i, o in enumerate(outputs):
        if type(o) is not type(first) and not (isinstance(o, torch.Tensor) and isinstance(first, torch.Tensor)):
            raise TypeError(f"fastpar.DataParallel: replica {i} returned {type(o).__name__} at {path} but "
                            f"replica 0 returned {type(first).__name__}")
    if isinstance(first, torch.Tensor):
        if first.dim() == 0:
            return _gather_scalars(outputs, sizes, destination, scalar_mode)
        if len(outputs) == 1:
            return first.to(destination)
        if any(o.requires_grad for o in outputs) and torch.is_grad_enabled():
            return _Gather.apply(destination, dim, *outputs)
        return comm.gather([o.contiguous() for o in outputs], dim, destination)
    if first is None:
        return None
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(gather_nested(col, sizes, destination, dim, scalar_mode, f"{path}.{name}")
                             for name, col in zip(first._fields, zip(*outputs))))
    if isinstance(first, (list, tuple)):
        for i, o in enumerate(outputs):
            if len(o) != len(first):
                raise ValueError(f"fastpar.DataParallel: replica {i} returned {len(o)} items at {path} but "
                                 f"replica 0 returned {len(first)}")
        return type(first)(gather_nested(col, sizes, destination, dim, scalar_mode, f"{path}[{j}]")
                           for j, col in enumerate(zip(*outputs)))
    if isinstance(first, dict):
        for i, o in enumerate(outputs):
            if o.keys() != first.keys():
                raise ValueError(f"fastpar.DataParallel: replica {i} returned keys {sorted(map(str, o))} at "
                                 f"{path} but replica 0 returned {sorted(map(str, first))}")
        return type(first)((k, gather_nested([o[k] for o in outputs], sizes, destination, dim, scalar_mode,
                                             f"{path}[{k!r}]")) for k in first)
    return list(outputs)  # other Python values: one per replica
