"""The persistent replicas behind fastpar.DataParallel.

Replica 0 is the user's module. Replicas 1.. are deep copies, built once (and
again only if the module's tensors are replaced, resized, retyped or frozen).
Before a forward their parameters and buffers receive the master's values in
one fastpar copy_many_; their gradients accumulate into one flat buffer per
(replica, dtype); at the end of backward one fastpar reduce sums those buffers
and the sum is added to the master's .grad, so the optimizer built on
``model.parameters()`` sees the gradient of the whole batch.
"""
from __future__ import annotations

import copy
import threading
from typing import Dict, List, Set

import torch
from torch import nn

from ._args import REDUCE_OPS
from ._grad_hooks import GradHooks

_SUM = REDUCE_OPS["SUM"]


class ReplicaSet:
    def __init__(self, master: nn.Module, devices: List[torch.device]):
        self.master = master
        self.devices = devices
        self.copies: List[nn.Module] = []
        self._lock = threading.Lock()  # CUDA backward fires hooks from one thread per device
        self._params: List[torch.Tensor] = []
        self._buffers: List[torch.Tensor] = []
        self._shapes: list = []
        self._fired: Set[int] = set()  # replicas whose gradients arrived in this backward
        self._got_grad: Set[int] = set()  # parameter indices that received a gradient
        self._callback_queued = False
        # True between a grad-enabled forward and the end of its backward: the
        # replicas' tensors are then saved in a live graph and must not be
        # overwritten unless the master really changed (see _sync).
        self._graph_pending = False
        self._grad_hooks = GradHooks(self, ReplicaSet._on_grad)

    def __getstate__(self):
        # Copies, hooks and the lock are rebuilt on first use: this keeps
        # copy.deepcopy(model) and torch.save(model) working.
        return {"master": self.master, "devices": self.devices}

    def __setstate__(self, state):
        self.__init__(state["master"], state["devices"])

    # -- building ---------------------------------------------------------------
    def _stale(self, params: List[torch.Tensor], buffers: List[torch.Tensor]) -> bool:
        if len(params) != len(self._params) or len(buffers) != len(self._buffers):
            return True
        now = [(t.shape, t.dtype, t.device, t.requires_grad) for t in params + buffers]
        same = all(a is b for a, b in zip(params + buffers, self._params + self._buffers))
        return not same or now != self._shapes

    def _build(self, params: List[torch.Tensor], buffers: List[torch.Tensor]) -> None:
        self._params, self._buffers = params, buffers
        self._grad_hooks.remove()  # the replicas they were on are replaced
        self._shapes = [(t.shape, t.dtype, t.device, t.requires_grad) for t in params + buffers]
        self._synced: List[List[int]] = []
        self.copies, self._flats, self._views, self._module_pairs = [], [], [], []
        self._groups: Dict[torch.dtype, List[int]] = {}
        for j, p in enumerate(params):
            if p.requires_grad:
                self._groups.setdefault(p.dtype, []).append(j)
        for r, dev in enumerate(self.devices[1:]):
            replica = copy.deepcopy(self.master).to(dev)
            rparams = list(replica.parameters())
            flats: Dict[torch.dtype, torch.Tensor] = {}
            views: Dict[int, torch.Tensor] = {}
            for dtype, idxs in self._groups.items():
                flat = torch.zeros(sum(params[j].numel() for j in idxs), dtype=dtype, device=dev)
                off = 0
                for j in idxs:
                    views[j] = flat[off: off + params[j].numel()].view_as(rparams[j])
                    off += params[j].numel()
                flats[dtype] = flat
            for j, p in enumerate(rparams):
                p.grad = views.get(j)
                if p.requires_grad:
                    self._grad_hooks.add(p, r, j)
            self.copies.append(replica)
            self._module_pairs.append(list(zip(self.master.modules(), replica.modules())))
            self._flats.append(flats)
            self._views.append(views)
            self._synced.append([-1] * (len(params) + len(buffers)))

    # -- forward ------------------------------------------------------------------
    def prepare(self, n: int, params: List[torch.Tensor], buffers: List[torch.Tensor]) -> List[nn.Module]:
        """The n modules to run (master first), holding the master's current values;
        ``params`` and ``buffers`` are the master's, in registration order."""
        if self._stale(params, buffers):
            self._build(params, buffers)
        self._sync(n - 1)
        for r in range(n - 1):
            for mm, cm in self._module_pairs[r]:
                cm.training = mm.training
        if torch.is_grad_enabled() and n > 1:  # only copies' tensors matter here
            self._graph_pending = True
        return [self.master] + self.copies[: n - 1]

    def _sync(self, count: int) -> None:
        """Copies master tensors into the first ``count`` replicas. Every tensor
        is copied, unless a graph from an earlier forward is still waiting for
        its backward: then only tensors whose version counter moved are, so that
        two forwards before one backward keep working (an in-place overwrite
        would invalidate the saved tensors). Always copying otherwise keeps
        updates through ``.data``, which bump no version counter, correct."""
        master = self._params + self._buffers
        srcs, dsts = [], []
        for r in range(count):
            mine = list(self.copies[r].parameters()) + list(self.copies[r].buffers())
            synced = self._synced[r]
            for k, m in enumerate(master):
                if not self._graph_pending or synced[k] != m._version:
                    srcs.append(m)
                    dsts.append(mine[k])
                    synced[k] = m._version
        if srcs:
            with torch.no_grad():
                torch.ops.fastpar.copy_many_(srcs, dsts)

    # -- backward -----------------------------------------------------------------
    def _on_grad(self, r: int, j: int, param: torch.Tensor) -> None:
        with self._lock:
            self._fired.add(r)
            self._got_grad.add(j)
            if not self._callback_queued:
                self._callback_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._reduce_into_master)

    def _reduce_into_master(self) -> None:
        with self._lock:
            fired, got = sorted(self._fired), self._got_grad
            self._fired, self._got_grad = set(), set()
            self._callback_queued = False
            self._graph_pending = False
        master_dev = self.devices[0]
        for r in fired:
            # A backward with create_graph=True replaces .grad by .grad + new
            # instead of accumulating into our view: copy the total back in.
            rparams = list(self.copies[r].parameters())
            for j, v in self._views[r].items():
                g = rparams[j].grad
                if g is not None and g.data_ptr() != v.data_ptr():
                    v.copy_(g.detach())
                    rparams[j].grad = v
        for dtype, idxs in self._groups.items():
            flats = [self._flats[r][dtype] for r in fired]
            total = torch.empty(flats[0].numel(), dtype=dtype, device=master_dev)
            torch.ops.fastpar.reduce_(flats, total, _SUM)
            grads, adds, off = [], [], 0
            for j in idxs:
                p = self._params[j]
                v = total[off: off + p.numel()].view_as(p)
                off += p.numel()
                if j not in got:
                    continue  # no replica used it: leave .grad as single-device training would
                if p.grad is None:
                    p.grad = v  # `total` is fresh each step, so this view aliases nothing else
                else:
                    grads.append(p.grad)
                    adds.append(v)
            if grads:
                torch._foreach_add_(grads, adds)
            for f in flats:
                f.zero_()
