"""fastpar.DataParallel: single-process data parallelism, a drop-in for
torch.nn.DataParallel.

    model = fastpar.DataParallel(net, device_ids=["cpu", "cpu"])   # or [0, 1, 2, 3]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss = F.cross_entropy(model(x), y); loss.backward(); opt.step()

What it does differently from nn.DataParallel, and why:

* Replicas persist between steps. ``self.module`` is replica 0 and holds the
  parameters the optimizer sees; replicas 1.. are deep copies whose parameter
  values are refreshed in place (one fastpar copy of all tensors) before each
  forward, instead of rebuilding Module objects every forward. Their gradients
  are views into one flat buffer per replica; when backward finishes, one
  fastpar reduce sums those buffers and the sum is added to the master
  gradients. benchmarks/bench_data_parallel.py measures this against
  rebuilding replicas each forward.
* The batch is split evenly over ``min(len(device_ids), batch)`` replicas, so
  uneven batches and batches smaller than the device count just work; the
  gradient is the gradient of the loss on the whole batch (the sum over replicas
  of the gradients flowing back through the gather), which is what
  single-device training computes.
* A 0-dim output (a loss computed inside forward) is combined as a mean
  weighted by chunk size (``scalar_gather="weighted_mean"``), so it equals
  the loss over the whole batch; ``"sum"`` or ``"stack"`` (nn.DataParallel's
  vector of per-replica values) are available.
* ``state_dict()`` has the wrapped module's plain keys (no ``module.``), and
  ``load_state_dict`` takes plain keys or a checkpoint of nn.DataParallel.
* CPU "devices" (``device_ids=["cpu", "cpu"]``) are accepted: each replica is
  its own copy in host memory.

Buffers (e.g. BatchNorm running stats) behave as in nn.DataParallel: replica 0
updates the module's buffers; the other replicas start from a copy each forward.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch import nn

from . import _nested
from ._replicas import ReplicaSet
from .ddp import _to_device

__all__ = ["DataParallel"]


def _normalize_devices(device_ids: Optional[Sequence[Any]]) -> List[torch.device]:
    if device_ids is None:
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return [torch.device("cuda", i) for i in range(n)] or [torch.device("cpu")]
    if isinstance(device_ids, (str, int, torch.device)) or not isinstance(device_ids, Sequence):
        raise TypeError(f"fastpar.DataParallel: device_ids must be a list of devices, got {device_ids!r}")
    if len(device_ids) == 0:
        raise ValueError("fastpar.DataParallel: device_ids is an empty list; give at least one device")
    devs: List[torch.device] = []
    for i, d in enumerate(device_ids):
        try:
            dev = torch.device("cuda", d) if isinstance(d, int) else torch.device(d)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"fastpar.DataParallel: device_ids[{i}] is {d!r}, which is not a device ({e})") from None
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        if dev.type not in ("cpu", "cuda"):
            raise ValueError(f"fastpar.DataParallel: device_ids[{i}] is '{dev}'; only CPU and CUDA devices are supported")
        if devs and dev.type != devs[0].type:
            raise ValueError(f"fastpar.DataParallel: device_ids[{i}] is '{dev}' but device_ids[0] is '{devs[0]}'; "
                             f"all devices must be CPU or all CUDA")
        if dev.type == "cuda" and dev in devs:
            raise ValueError(f"fastpar.DataParallel: device_ids[{i}] is '{dev}', the same device as "
                             f"device_ids[{devs.index(dev)}]; each CUDA device may appear once")
        devs.append(dev)
    return devs


class DataParallel(nn.Module):
    """Same constructor as torch.nn.DataParallel, plus ``scalar_gather``
    (how 0-dim outputs of the replicas are combined: "weighted_mean", "sum"
    or "stack")."""

    def __init__(self, module: nn.Module, device_ids: Optional[Sequence[Any]] = None,
                 output_device: Any = None, dim: int = 0, *, scalar_gather: str = "weighted_mean"):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"fastpar.DataParallel: module must be a torch.nn.Module, got {type(module).__name__}")
        if scalar_gather not in _nested.SCALAR_GATHER_MODES:
            raise ValueError(f"fastpar.DataParallel: scalar_gather is {scalar_gather!r}; it must be one of "
                             f"{_nested.SCALAR_GATHER_MODES}")
        if not isinstance(dim, int):
            raise TypeError(f"fastpar.DataParallel: dim must be an int, got {dim!r}")
        self.module = module
        self.devices = _normalize_devices(device_ids)
        self.device_ids = [d.index if d.type == "cuda" else str(d) for d in self.devices]
        self.src_device_obj = self.devices[0]
        if output_device is None:
            self.output_device = self.devices[0]
        else:
            self.output_device = (torch.device("cuda", output_device) if isinstance(output_device, int)
                                  else torch.device(output_device))
        self.dim = dim
        self.scalar_gather = scalar_gather
        self._check_on_source()
        # Plain attribute, not a submodule: the replicas' tensors must not show up in
        # parameters(), state_dict() or the optimizer.
        self.__dict__["_replica_set"] = ReplicaSet(module, self.devices)
        self._register_state_dict_hook(_strip_module_prefix)
        self._register_load_state_dict_pre_hook(_add_module_prefix, with_module=True)

    def _check_on_source(self) -> tuple:
        """The module's parameters and buffers, after checking they are all on device_ids[0]."""
        params, buffers = list(self.module.parameters()), list(self.module.buffers())
        src = self.src_device_obj
        if any(t.device != src for t in params) or any(t.device != src for t in buffers):
            for name, t in list(self.module.named_parameters()) + list(self.module.named_buffers()):
                if t.device != src:
                    raise RuntimeError(f"fastpar.DataParallel: module must have its parameters and buffers on "
                                       f"device '{src}' (device_ids[0]) but '{name}' is on '{t.device}'")
        return params, buffers

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        params, buffers = self._check_on_source()
        batch = _nested.batch_size((inputs, kwargs), self.dim, "(inputs, kwargs)")
        if batch is None or len(self.devices) == 1:
            # Nothing to split (or one device): run the module itself, inputs on its device.
            args, kw = _to_device((inputs, kwargs), self.src_device_obj)
            out = self.module(*args, **kw)
            return _nested.gather_nested([out], [batch or 1], self.output_device, self.dim, self.scalar_gather)
        sizes = _nested.balanced_chunk_sizes(batch, len(self.devices))
        devices = self.devices[: len(sizes)]
        per_replica = _nested.scatter_nested((inputs, kwargs), devices, sizes, self.dim)
        replicas = self._replica_set.prepare(len(sizes), params, buffers)
        outputs = _parallel_apply(replicas, per_replica, devices)
        return _nested.gather_nested(outputs, sizes, self.output_device, self.dim, self.scalar_gather)

    def replicas(self) -> List[nn.Module]:
        """The modules that run on device_ids (index 0 is ``self.module``), for inspection and tests."""
        return [self.module] + list(self._replica_set.copies)


def _parallel_apply(replicas: List[nn.Module], args: List[Any], devices: List[torch.device]) -> List[Any]:
    """Runs replica i on args[i]. CPU replicas run one after another: each op
    already uses every core through intra-op parallelism, and running
    replicas in threads on top oversubscribes them (measured slower in
    benchmarks/bench_data_parallel.py). CUDA replicas run in one thread per
    device, each on its device's current stream, as nn.parallel.parallel_apply."""
    if devices[0].type == "cpu":
        return [m(*a, **kw) for m, (a, kw) in zip(replicas, args)]
    results: Dict[int, Any] = {}
    grad_enabled = torch.is_grad_enabled()
    autocast = torch.is_autocast_enabled("cuda")
    autocast_dtype = torch.get_autocast_dtype("cuda")

    def work(i: int) -> None:
        try:
            with torch.set_grad_enabled(grad_enabled), torch.cuda.device(devices[i]), \
                    torch.autocast("cuda", dtype=autocast_dtype, enabled=autocast):
                a, kw = args[i]
                results[i] = replicas[i](*a, **kw)
        except BaseException as e:  # re-raised in the caller's thread, naming the replica
            results[i] = e

    threads = [threading.Thread(target=work, args=(i,)) for i in range(1, len(replicas))]
    for t in threads:
        t.start()
    work(0)
    for t in threads:
        t.join()
    out = []
    for i in range(len(replicas)):
        r = results[i]
        if isinstance(r, BaseException):
            raise RuntimeError(f"fastpar.DataParallel: replica {i} on device '{devices[i]}' failed: {r!r}") from r
        out.append(r)
    return out


def _relative(key: str, prefix: str) -> Optional[str]:
    """A metadata key (module path, no trailing dot) relative to ``prefix``; None if outside it."""
    if not prefix:
        return key
    if key == prefix[:-1]:
        return ""
    return key[len(prefix):] if key.startswith(prefix) else None


def _strip_module_prefix(module: nn.Module, state_dict: Dict[str, Any], prefix: str, local_metadata: Any) -> None:
    """state_dict hook: 'prefix.module.x' -> 'prefix.x', so checkpoints load into the bare model."""
    inner = prefix + "module."
    for key in [k for k in state_dict if k.startswith(inner)]:
        state_dict[prefix + key[len(inner):]] = state_dict.pop(key)
    meta = getattr(state_dict, "_metadata", None)
    for key in list(meta or ()):
        rel = _relative(key, prefix)
        if rel == "module":
            meta[prefix[:-1]] = meta.pop(key)
        elif rel is not None and rel.startswith("module."):
            meta[prefix + rel[len("module."):]] = meta.pop(key)


def _add_module_prefix(module: nn.Module, state_dict: Dict[str, Any], prefix: str, local_metadata: Any,
                       strict: bool, missing_keys: List[str], unexpected_keys: List[str],
                       error_msgs: List[str]) -> None:
    """load_state_dict pre-hook: plain keys 'prefix.x' -> 'prefix.module.x'. Keys
    already carrying 'module.' (an nn.DataParallel checkpoint) are kept as they are."""
    inner = prefix + "module."
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(inner)]:
        state_dict[inner + key[len(prefix):]] = state_dict.pop(key)
    meta = getattr(state_dict, "_metadata", None)
    for key in list(meta or ()):
        rel = _relative(key, prefix)
        if rel is None or rel == "module" or rel.startswith("module."):
            continue
        new = inner + rel if rel else inner[:-1]
        # The wrapper's own entry ("" relative) is kept as well: it describes the wrapper.
        meta[new] = meta[key] if rel == "" else meta.pop(key)
