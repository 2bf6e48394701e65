"""fastpar.DistributedDataParallel: multi-process data parallelism with
gradient buckets allreduced while backward is still running.

    dist.init_process_group("fastpar")            # or "gloo" / "nccl"
    model = fastpar.DistributedDataParallel(net, bucket_cap_mb=25)
    loss_fn(model(x), y).backward(); opt.step()

Same constructor names and semantics as torch.nn.parallel.DistributedDataParallel
for the subset in __init__ (output_device and dim are accepted for
compatibility: one device per process needs neither). Not provided:
static_graph, join() for uneven numbers of batches, comm hooks of its own
(use fastpar.comm_hook with stock DDP), mixed-device modules. How it works:

* At construction rank 0's parameters and buffers are broadcast to every rank.
* Parameters that need gradients are packed, in reverse registration order
  (roughly the order backward produces them), into flat buckets: the first
  of 1 MiB so communication starts early, the rest of ``bucket_cap_mb``.
  Bucket memory comes from fastpar.bucket_storage.allocate_bucket_storage:
  registered memory on the fastpar backend (CPU shared memory; the CUDA IPC
  arena when FASTPAR_CUDA_IPC_REGISTERED_BYTES gives it room), torch.zeros
  elsewhere.
* A post-accumulate-grad hook copies each gradient into its bucket slot
  (nothing to copy when .grad already is that slot); when a bucket is full
  its all_reduce is launched asynchronously, in bucket order on every rank,
  while backward computes the remaining gradients. On the fastpar backend a
  CPU bucket's all_reduce completes on the calling thread in microseconds
  (launching is running), so it is the direct call
  (fastpar.distributed.all_reduce) with ReduceOp.AVG for float32 and float64:
  the same bits as a SUM divided by the world size afterwards, in one pass
  over the bucket and without torch.distributed's per-call path.
  ``launched_from_hooks`` counts the buckets of the last backward that went
  out before it finished.
* When backward ends (an autograd engine callback) all work is waited on, the
  sums are divided by the world size (where the all_reduce did not average)
  and written to ``.grad``.
* With ``broadcast_buffers`` every forward first overwrites the buffers with
  rank 0's: those of the submodules that held buffers at construction (a
  submodule's first buffer registered later is not synchronized).

Per backward the wrapper costs one small Python hook per parameter, one
collective per bucket and one copy out of the buckets: its state lives in
plain objects, since every assignment to an nn.Module attribute goes through
Module.__setattr__ (a few microseconds each).

Gradients are averaged over ranks, as in torch: with equal local batches and
mean-reduced losses that is the gradient of the global batch. With unequal
local batches, weight each rank's loss by ``world_size * n_local / n_global``
(or use reduction="sum" scaled by ``world_size / n_global``) to get exactly
the global-batch gradient.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from ._grad_hooks import GradHooks
from .bucket_storage import allocate_bucket_storage, storage_kind, uses_fastpar_backend
from .distributed import all_reduce as _direct_all_reduce

__all__ = ["DistributedDataParallel"]

_FIRST_BUCKET_BYTES = 1024 * 1024  # as torch DDP: a small first bucket starts communication early
_BROADCAST_BUCKET_BYTES = 250 * 1024 * 1024  # module-state broadcast chunk, as torch DDP
# Dtypes whose fastpar AVG is bit for bit the SUM divided by the world size
# afterwards: they reduce in their own precision and divide once, as div_ does
# (16-bit types reduce in float32 and would round once instead of twice).
_AVG_SAME_BITS = (torch.float32, torch.float64)


class _Bucket:
    """One flat tensor holding the gradients of ``params`` back to back.
    ``direct``: its all_reduce is the fastpar direct call, which averages in
    place before returning (no Work to wait on, nothing left to divide)."""

    def __init__(self, index: int, params: List[torch.Tensor], names: List[str], storage: torch.Tensor,
                 direct: bool):
        self.index, self.params, self.names, self.flat, self.direct = index, params, names, storage, direct
        self.views, off = [], 0
        for p in params:
            self.views.append(storage[off: off + p.numel()].view_as(p))
            off += p.numel()
        self.ready = [False] * len(params)
        self.pending = len(params)
        self.work: Optional[dist.Work] = None

    def reset(self) -> None:
        self.ready = [False] * len(self.params)
        self.pending = len(self.params)
        self.work = None


class _Backward:
    """Where the synchronized backward in progress stands."""

    __slots__ = ("armed", "finishing", "callback_queued", "next_bucket", "launched_from_hooks")

    def __init__(self) -> None:
        self.armed = self.finishing = self.callback_queued = False
        self.next_bucket = self.launched_from_hooks = 0


def _assign_buckets(params: List[torch.Tensor], cap_bytes: int) -> List[List[int]]:
    """Indices of ``params`` (already in reverse order) grouped into buckets of one
    dtype and device; the first is capped at 1 MiB, the others at ``cap_bytes``."""
    buckets: List[List[int]] = []
    size, key = 0, None
    for i, p in enumerate(params):
        k = (p.dtype, p.device)
        limit = min(_FIRST_BUCKET_BYTES, cap_bytes) if len(buckets) == 1 else cap_bytes
        nbytes = p.numel() * p.element_size()
        if not buckets or k != key or (size + nbytes > limit and size > 0):
            buckets.append([])
            size, key = 0, k
        buckets[-1].append(i)
        size += nbytes
    return buckets


def _to_device(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_to_device(x, device) for x in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(x, device) for x in obj)
    if isinstance(obj, dict):
        return type(obj)((k, _to_device(v, device)) for k, v in obj.items())
    return obj


def broadcast_tensors(tensors: Sequence[torch.Tensor], process_group: Optional[dist.ProcessGroup],
                      src_group_rank: int = 0) -> None:
    """Overwrite ``tensors`` with the values held by group rank ``src_group_rank``,
    a few flat broadcasts rather than one per tensor."""
    src = dist.get_global_rank(process_group or dist.group.WORLD, src_group_rank)
    groups: dict = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    for group in groups.values():
        start = 0
        while start < len(group):
            chunk, nbytes = [], 0
            while start < len(group) and (not chunk or nbytes + group[start].nbytes <= _BROADCAST_BUCKET_BYTES):
                chunk.append(group[start])
                nbytes += group[start].nbytes
                start += 1
            flat = _flatten_dense_tensors([t.detach() for t in chunk])
            dist.broadcast(flat, src=src, group=process_group)
            with torch.no_grad():
                for t, v in zip(chunk, _unflatten_dense_tensors(flat, chunk)):
                    t.copy_(v)


class DistributedDataParallel(nn.Module):
    def __init__(self, module: nn.Module, device_ids: Optional[Sequence[Any]] = None,
                 output_device: Any = None, dim: int = 0, broadcast_buffers: bool = True,
                 init_sync: bool = True, process_group: Optional[dist.ProcessGroup] = None,
                 bucket_cap_mb: Optional[float] = None, find_unused_parameters: bool = False,
                 gradient_as_bucket_view: bool = False):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"fastpar.DistributedDataParallel: module must be a torch.nn.Module, got "
                            f"{type(module).__name__}")
        if not dist.is_initialized():
            raise RuntimeError("fastpar.DistributedDataParallel: torch.distributed is not initialized; call "
                               "dist.init_process_group(...) first")
        if bucket_cap_mb is None:
            bucket_cap_mb = 25
        if not isinstance(bucket_cap_mb, (int, float)) or bucket_cap_mb <= 0:
            raise ValueError(f"fastpar.DistributedDataParallel: bucket_cap_mb is {bucket_cap_mb!r}; it must be a "
                             f"positive number of MiB")
        if device_ids is not None and len(device_ids) != 1:
            raise ValueError(f"fastpar.DistributedDataParallel: device_ids must hold exactly one device (the one "
                             f"this process drives), got {list(device_ids)!r}")
        self.module = module
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.device_ids = list(device_ids) if device_ids is not None else None
        self.device = (torch.device("cuda", device_ids[0]) if device_ids and isinstance(device_ids[0], int)
                       else torch.device(device_ids[0]) if device_ids else None)
        self.output_device = output_device
        self.dim = dim
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.bucket_cap_mb = bucket_cap_mb
        self.require_backward_grad_sync = True
        for name, p in module.named_parameters():
            if self.device is not None and p.device != self.device:
                raise ValueError(f"fastpar.DistributedDataParallel: parameter '{name}' is on '{p.device}' but "
                                 f"device_ids[0] is '{self.device}'; move the module first")
        if init_sync and self.world_size > 1:
            broadcast_tensors(list(module.parameters()) + list(module.buffers()), process_group)
        # The submodules whose buffers each forward broadcasts, found once: walking
        # every submodule on each forward costs even a model without buffers.
        self._buffer_owners = [m for m in module.modules() if m._buffers] if self.world_size > 1 else []
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad][::-1]
        self._build_buckets(named, int(bucket_cap_mb * 1024 * 1024))
        self._lock = threading.Lock()
        self._backward_state = _Backward()

    @property
    def launched_from_hooks(self) -> int:
        """Buckets of the last synchronized backward whose all_reduce went out
        from a gradient hook, before backward had finished."""
        return self._backward_state.launched_from_hooks

    # -- construction -----------------------------------------------------------------
    def _build_buckets(self, named: List[tuple], cap_bytes: int) -> None:
        params = [p for _, p in named]
        self.buckets: List[_Bucket] = []
        self._grad_hooks = GradHooks(self, DistributedDataParallel._on_grad)
        fastpar_cpu = uses_fastpar_backend(self.process_group, "cpu")
        for bi, idxs in enumerate(_assign_buckets(params, cap_bytes)):
            ps = [params[i] for i in idxs]
            storage = allocate_bucket_storage(sum(p.numel() for p in ps), ps[0].dtype, ps[0].device,
                                              self.process_group)
            direct = fastpar_cpu and storage.device.type == "cpu" and storage.dtype in _AVG_SAME_BITS
            bucket = _Bucket(bi, ps, [named[i][0] for i in idxs], storage, direct)
            for pos, p in enumerate(ps):
                self._grad_hooks.add(p, bucket, pos)
            self.buckets.append(bucket)
        device = params[0].device if params else torch.device("cpu")
        self.bucket_storage_kind = storage_kind(self.process_group, device)

    # -- forward ------------------------------------------------------------------------
    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if self.device is not None:
            inputs, kwargs = _to_device(inputs, self.device), _to_device(kwargs, self.device)
        if self.broadcast_buffers and self._buffer_owners:
            # read at every forward: .to() and friends replace buffer tensors
            buffers = {id(b): b for m in self._buffer_owners for b in m._buffers.values() if b is not None}
            if buffers:
                broadcast_tensors(list(buffers.values()), self.process_group)
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            self._arm()
        else:
            self._backward_state.armed = False
        return self.module(*inputs, **kwargs)

    def _arm(self) -> None:
        """Expect one backward whose gradients are to be synchronized."""
        for b in self.buckets:
            b.reset()
        s = self._backward_state
        s.next_bucket = s.launched_from_hooks = 0
        s.finishing = s.callback_queued = False
        s.armed = True

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes of forwards run inside accumulate gradients locally;
        the first synchronized backward afterwards averages the accumulated sum."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    # -- backward -----------------------------------------------------------------------
    def _on_grad(self, bucket: _Bucket, pos: int, param: torch.Tensor) -> None:
        s = self._backward_state
        if not s.armed:
            return
        with self._lock:
            if not s.callback_queued:
                s.callback_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
            if bucket.ready[pos]:
                raise RuntimeError(f"fastpar.DistributedDataParallel: parameter '{bucket.names[pos]}' received "
                                   f"a gradient twice in one synchronized backward; run forward again before "
                                   f"each backward (or use no_sync())")
            view, grad = bucket.views[pos], param.grad
            if grad.data_ptr() != view.data_ptr():
                view.copy_(grad)
            bucket.ready[pos] = True
            bucket.pending -= 1
            if bucket.pending == 0:  # only a completed bucket can let buckets go out
                self._launch_ready_buckets()

    def _launch_ready_buckets(self) -> None:
        # Strictly in bucket order, so every rank issues the same collectives in the same order.
        s, buckets = self._backward_state, self.buckets
        while s.next_bucket < len(buckets) and buckets[s.next_bucket].pending == 0:
            b = buckets[s.next_bucket]
            if not s.finishing:
                s.launched_from_hooks += 1
            if b.direct:
                _direct_all_reduce(b.flat, op=dist.ReduceOp.AVG, group=self.process_group)
            else:
                b.work = dist.all_reduce(b.flat, op=dist.ReduceOp.SUM, group=self.process_group, async_op=True)
            s.next_bucket += 1

    def _finish_backward(self) -> None:
        with self._lock:
            s = self._backward_state
            s.armed = False
            s.finishing = True
            unused = ([(b, pos) for b in self.buckets for pos in range(len(b.params)) if not b.ready[pos]]
                      if any(b.pending for b in self.buckets) else [])
            if unused and not self.find_unused_parameters:
                names = [b.names[pos] for b, pos in unused]
                raise RuntimeError(f"fastpar.DistributedDataParallel: {len(names)} parameter(s) received no "
                                   f"gradient in this backward: {names}; pass find_unused_parameters=True if "
                                   f"the forward does not use every parameter")
            for b, pos in unused:
                b.views[pos].zero_()
                b.ready[pos] = True
                b.pending -= 1
            self._launch_ready_buckets()
        used_anywhere = None
        if self.find_unused_parameters:
            # One small extra collective tells which parameters some rank used;
            # the others keep their .grad untouched, as torch DDP does.
            skipped = {(b.index, pos) for b, pos in unused}
            local = torch.tensor([0 if (b.index, pos) in skipped else 1
                                  for b in self.buckets for pos in range(len(b.params))],
                                 dtype=torch.int32, device=self.buckets[0].flat.device)
            dist.all_reduce(local, op=dist.ReduceOp.SUM, group=self.process_group)
            used_anywhere = local.tolist()
        k = 0
        grads, views = [], []  # one copy out for every bucket
        for b in self.buckets:
            if not b.direct:
                b.work.wait()
                b.work = None  # a finished Work holds the bucket and the group's state
                b.flat.div_(self.world_size)
            for p, v in zip(b.params, b.views):
                use = used_anywhere is None or used_anywhere[k] > 0
                k += 1
                if not use:
                    continue
                g = p.grad
                if g is None or self.gradient_as_bucket_view:
                    p.grad = v if self.gradient_as_bucket_view else v.clone()
                elif g.data_ptr() != v.data_ptr():
                    grads.append(g)
                    views.append(v)
        if grads:
            torch._foreach_copy_(grads, views)
