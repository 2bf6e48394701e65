"""Single-process collectives over a list of tensors, each on some device.

The names and semantics follow torch.cuda.comm (broadcast, scatter, gather,
reduce_add, *_coalesced) and torch.cuda.nccl (all_reduce, reduce, all_gather,
reduce_scatter), with two extensions:

* Each list entry is its own buffer, so a device may appear more than once:
  `devices` may repeat "cpu" or a GPU (``scatter(x, ["cuda:0", "cuda:0"])``),
  and ``allreduce([a, b])`` with a and b both on cuda:0 is one kernel launch.
  Entries an op writes must not overlap in memory (refused, naming both).
* CPU tensors are first-class: a real, multi-threaded, vectorized path, not
  a test double.
* ``op`` takes torch.distributed.ReduceOp values: SUM, AVG, PRODUCT, MIN, MAX.
  16-bit floats accumulate in fp32; every output of an allreduce holds
  identical bits.

The heavy lifting is in torch.ops.fastpar.* (csrc/torch/ops); this module allocates
outputs, cuts tensors into views, and checks arguments before any work starts.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed import ReduceOp

from . import _C, _args

_ops = torch.ops.fastpar
_is_compiling = torch.compiler.is_compiling


def _allreduce_(ts: list, op: int, algorithm: str) -> None:
    # torch.ops.fastpar.allreduce_'s Python side is a large part of a small
    # call; the extension's entry reaches the same op through the dispatcher
    # in C++. A torch.compile trace needs the op itself.
    if _is_compiling():
        _ops.allreduce_(ts, op, algorithm)
    else:
        _C._allreduce_(ts, op, algorithm)

DEFAULT_BUFFER_SIZE = 10 * 1024 * 1024  # bytes per coalesced bucket, as torch.cuda.comm


def allreduce(tensors: Sequence[torch.Tensor], op: Any = ReduceOp.SUM,
              outputs: Optional[Sequence[torch.Tensor]] = None, *, algorithm: str = "auto") -> List[torch.Tensor]:
    """Reduce ``tensors`` (same shape and dtype; devices may repeat) with ``op`` and
    write the result into every one of them in place (or into ``outputs``).

    algorithm: "auto" (best for the devices), "direct" (one pass that reads all
    inputs and writes all outputs) or "ring" (reduce-scatter then allgather,
    pipelined in chunks). Returns the tensors that hold the result.
    """
    ts = _args.tensor_list("allreduce", "tensors", tensors)
    opv = _args.op_value("allreduce", op)
    if outputs is not None:
        outs = _args.tensor_list("allreduce", "outputs", outputs)
        _args.same_length("allreduce", "outputs", outs, "tensors", ts)
        _ops.copy_many_(ts, outs)
        ts = outs
    _allreduce_(ts, opv, algorithm)
    return ts


all_reduce = allreduce


def allreduce_coalesced(tensors: Sequence[Sequence[torch.Tensor]], op: Any = ReduceOp.SUM,
                        buffer_size: int = DEFAULT_BUFFER_SIZE) -> None:
    """Allreduce many small tensors at once, in place. ``tensors[i]`` is the list
    of tensors held by device i (the orientation of torch.cuda.comm.reduce_add_coalesced).
    Tensors are packed into flat buckets of up to ``buffer_size`` bytes of one dtype."""
    opv = _args.op_value("allreduce_coalesced", op)
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)) or not tensors:
        raise ValueError("fastpar.allreduce_coalesced: tensors must be a non-empty list with one list of "
                         f"tensors per device, got {type(tensors).__name__}")
    per_dev = [_args.tensor_list("allreduce_coalesced", f"tensors[{i}]", t, allow_empty=True)
               for i, t in enumerate(tensors)]
    for i, lst in enumerate(per_dev):
        _args.same_length("allreduce_coalesced", f"tensors[{i}]", lst, "tensors[0]", per_dev[0])
        for j, t in enumerate(lst):
            ref = per_dev[0][j]
            if t.shape != ref.shape or t.dtype != ref.dtype:
                raise ValueError(f"fastpar.allreduce_coalesced: tensors[{i}][{j}] has shape {list(t.shape)} "
                                 f"and dtype {t.dtype} but tensors[0][{j}] has shape {list(ref.shape)} "
                                 f"and dtype {ref.dtype}")
    for bucket in _buckets(per_dev[0], buffer_size):
        flats = [_flatten_dense_tensors([per_dev[i][j] for j in bucket]) for i in range(len(per_dev))]
        _allreduce_(flats, opv, "auto")
        for i, flat in enumerate(flats):
            group = [per_dev[i][j] for j in bucket]
            for t, r in zip(group, _unflatten_dense_tensors(flat, group)):
                t.copy_(r)


def reduce(inputs: Sequence[torch.Tensor], output: Optional[torch.Tensor] = None, root: int = 0,
           op: Any = ReduceOp.SUM) -> torch.Tensor:
    """``output`` (default: ``inputs[root]``, in place) = op over all inputs."""
    ins = _args.tensor_list("reduce", "inputs", inputs)
    _args.root_index("reduce", root, len(ins), "inputs")
    opv = _args.op_value("reduce", op)
    out = ins[root] if output is None else output
    _ops.reduce_(ins, out, opv)
    return out


def reduce_add(inputs: Sequence[torch.Tensor], destination: Any = None) -> torch.Tensor:
    """Sum of ``inputs`` as a new tensor on ``destination`` (default: the device
    of inputs[0]; -1 or "cpu" for the CPU), as torch.cuda.comm.reduce_add."""
    ins = _args.tensor_list("reduce_add", "inputs", inputs)
    dev = ins[0].device if destination is None else _args.device("reduce_add", "destination", destination)
    if dev.type != ins[0].device.type:
        # The kernels reduce within one kind of device: CUDA inputs to a CPU
        # destination (or the reverse) are reduced where the inputs are, then copied.
        return reduce_add(ins, ins[0].device).to(dev)
    out = torch.empty_like(ins[0], device=dev, memory_format=torch.contiguous_format)
    _ops.reduce_(ins, out, 0)
    return out


def reduce_add_coalesced(inputs: Sequence[Sequence[torch.Tensor]], destination: Any = None,
                         buffer_size: int = DEFAULT_BUFFER_SIZE) -> tuple:
    """Sums ``inputs[i][j]`` over devices i, for each j, into new tensors on ``destination``."""
    if isinstance(inputs, torch.Tensor) or not isinstance(inputs, (list, tuple)) or not inputs:
        raise ValueError("fastpar.reduce_add_coalesced: inputs must be a non-empty list with one list of "
                         "tensors per device")
    per_dev = [_args.tensor_list("reduce_add_coalesced", f"inputs[{i}]", t, allow_empty=True)
               for i, t in enumerate(inputs)]
    outs = [None] * len(per_dev[0])
    for bucket in _buckets(per_dev[0], buffer_size):
        flats = [_flatten_dense_tensors([per_dev[i][j] for j in bucket]) for i in range(len(per_dev))]
        total = reduce_add(flats, destination)
        for j, r in zip(bucket, _unflatten_dense_tensors(total, [per_dev[0][j] for j in bucket])):
            outs[j] = r
    return tuple(outs)


def broadcast(tensor: torch.Tensor, devices: Optional[Sequence[Any]] = None, *,
              out: Optional[Sequence[torch.Tensor]] = None) -> tuple:
    """A copy of ``tensor`` on each of ``devices`` (or into each of ``out``).
    As in torch.cuda.comm, a CUDA output on the source's own device is the
    source itself; CPU outputs are always separate buffers."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"fastpar.broadcast: tensor must be a Tensor, got {type(tensor).__name__}")
    if (devices is None) == (out is None):
        raise ValueError("fastpar.broadcast: exactly one of 'devices' and 'out' must be given")
    src = tensor.contiguous()
    if out is not None:
        outs = _args.tensor_list("broadcast", "out", out)
        for i, o in enumerate(outs):
            if o.shape != tensor.shape:
                raise ValueError(f"fastpar.broadcast: out[{i}] has shape {list(o.shape)} but tensor has "
                                 f"shape {list(tensor.shape)}")
        targets = outs
    else:
        devs = _args.device_list("broadcast", devices)
        outs = [src if (d.type == "cuda" and d == src.device) else torch.empty_like(src, device=d)
                for d in devs]
        targets = [o for o in outs if o is not src]
    if targets:
        _ops.broadcast_(src, targets)
    return tuple(outs)


def broadcast_coalesced(tensors: Sequence[torch.Tensor], devices: Sequence[Any],
                        buffer_size: int = DEFAULT_BUFFER_SIZE) -> tuple:
    """Broadcast a sequence of tensors to ``devices``, packing small tensors into
    flat buckets of up to ``buffer_size`` bytes. Returns one tuple per device."""
    ts = _args.tensor_list("broadcast_coalesced", "tensors", tensors, allow_empty=True)
    devs = _args.device_list("broadcast_coalesced", devices)
    for i, t in enumerate(ts):
        if t.device != ts[0].device:
            raise ValueError(f"fastpar.broadcast_coalesced: tensors[{i}] is on '{t.device}' but tensors[0] "
                             f"is on '{ts[0].device}'; all sources must be on one device")
    results: list = [[None] * len(ts) for _ in devs]
    for bucket in _buckets(ts, buffer_size):
        group = [ts[j] for j in bucket]
        flat = _flatten_dense_tensors(group)
        for d, copy in enumerate(broadcast(flat, devs)):
            for j, r in zip(bucket, _unflatten_dense_tensors(copy, group)):
                results[d][j] = r
    return tuple(tuple(r) for r in results)


def scatter(tensor: torch.Tensor, devices: Optional[Sequence[Any]] = None,
            chunk_sizes: Optional[Sequence[int]] = None, dim: int = 0, *,
            out: Optional[Sequence[torch.Tensor]] = None) -> tuple:
    """Split ``tensor`` along ``dim`` and put the i-th chunk on ``devices[i]``.

    ``chunk_sizes`` may be uneven (zeros allowed); without it the split is
    ``tensor.chunk(len(devices), dim)``, which, as in torch.cuda.comm, yields
    fewer chunks than devices when the dimension is short."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"fastpar.scatter: tensor must be a Tensor, got {type(tensor).__name__}")
    if (devices is None) == (out is None):
        raise ValueError("fastpar.scatter: exactly one of 'devices' and 'out' must be given")
    d = _args.dim_index("scatter", dim, tensor.dim())
    size = tensor.size(d) if tensor.dim() else 1
    if out is not None:
        outs = _args.tensor_list("scatter", "out", out)
        if chunk_sizes is not None:
            raise ValueError("fastpar.scatter: 'chunk_sizes' must not be given with 'out' "
                             "(the sizes of out decide the split)")
        sizes = [o.size(d) if o.dim() else 1 for o in outs]
        if sum(sizes) != size:
            raise ValueError(f"fastpar.scatter: the sizes of out along dim {d} sum to {sum(sizes)} but "
                             f"tensor.size({d}) is {size}")
    else:
        devs = _args.device_list("scatter", devices)
        if chunk_sizes is None:
            sizes = [c.size(d) if c.dim() else 1 for c in tensor.chunk(len(devs), d)] if size else [0] * len(devs)
        else:
            sizes = list(chunk_sizes)
            if len(sizes) != len(devs):
                raise ValueError(f"fastpar.scatter: chunk_sizes has {len(sizes)} entries but devices has "
                                 f"{len(devs)}")
            for i, c in enumerate(sizes):
                if not isinstance(c, int) or c < 0:
                    raise ValueError(f"fastpar.scatter: chunk_sizes[{i}] is {c!r}; chunk sizes must be "
                                     f"non-negative ints")
            if sum(sizes) != size:
                raise ValueError(f"fastpar.scatter: chunk_sizes sums to {sum(sizes)} but tensor.size({d}) "
                                 f"is {size}")
        outs = []
        for dev, c in zip(devs, sizes):
            shape = list(tensor.shape)
            if shape:
                shape[d] = c
            outs.append(torch.empty(shape, dtype=tensor.dtype, device=dev))
    srcs, offset = [], 0
    for o, c in zip(outs, sizes):
        srcs.append(tensor.narrow(d, offset, c) if tensor.dim() else tensor)
        offset += c
    for i, (s, o) in enumerate(zip(srcs, outs)):
        if s.shape != o.shape:
            raise ValueError(f"fastpar.scatter: out[{i}] has shape {list(o.shape)} but chunk {i} of tensor "
                             f"has shape {list(s.shape)}")
    _ops.copy_many_(srcs, outs)
    return tuple(outs)


def gather(tensors: Sequence[torch.Tensor], dim: Any = 0, destination: Any = None, *,
           out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Concatenate ``tensors`` along ``dim`` into one tensor on ``destination``
    (default: the device of tensors[0]; -1 or "cpu" for the CPU).

    torch.cuda.comm's order is (tensors, dim, destination); for convenience a
    device (str or torch.device) passed in the ``dim`` slot is taken as the
    destination, so ``gather(ts, "cpu")`` works too."""
    if isinstance(dim, (str, torch.device)):
        dim, destination = (destination if isinstance(destination, int) else 0), dim
    ts = _args.tensor_list("gather", "tensors", tensors)
    ref = ts[0]
    d = _args.dim_index("gather", dim, ref.dim(), "tensors[0]")
    for i, t in enumerate(ts):
        if t.dtype != ref.dtype:
            raise TypeError(f"fastpar.gather: tensors[{i}] has dtype {t.dtype} but tensors[0] has dtype {ref.dtype}")
        if t.dim() != ref.dim() or any(a != b for k, (a, b) in enumerate(zip(t.shape, ref.shape)) if k != d):
            raise ValueError(f"fastpar.gather: tensors[{i}] has shape {list(t.shape)} but tensors[0] has shape "
                             f"{list(ref.shape)}; they may differ only in dim {d}")
    sizes = [t.size(d) if t.dim() else 1 for t in ts]
    shape = list(ref.shape) if ref.dim() else [1]
    shape[d] = sum(sizes)
    if out is not None:
        if destination is not None:
            raise ValueError("fastpar.gather: 'destination' must not be given with 'out'")
        if list(out.shape) != shape:
            raise ValueError(f"fastpar.gather: out has shape {list(out.shape)} but the gathered shape is {shape}")
        result = out
    else:
        dev = ref.device if destination is None else _args.device("gather", "destination", destination)
        result = torch.empty(shape, dtype=ref.dtype, device=dev)
    dsts, offset = [], 0
    for t, c in zip(ts, sizes):
        dsts.append(result.narrow(d, offset, c) if t.dim() else result[offset])
        offset += c
    _ops.copy_many_(ts, dsts)
    return result


def allgather(inputs: Sequence[torch.Tensor], outputs: Optional[Sequence[torch.Tensor]] = None) -> list:
    """Each output holds all inputs concatenated (as all_gather_into_tensor):
    outputs[j].numel() == len(inputs) * inputs[0].numel(). Default outputs have
    shape (n * inputs[0].size(0), ...) on each input's device."""
    ins = _args.tensor_list("allgather", "inputs", inputs)
    n = len(ins)
    if outputs is None:
        shape = [n * ins[0].size(0), *ins[0].shape[1:]] if ins[0].dim() else [n]
        outs = [torch.empty(shape, dtype=t.dtype, device=t.device) for t in ins]
    else:
        outs = _args.tensor_list("allgather", "outputs", outputs)
        _args.same_length("allgather", "outputs", outs, "inputs", ins)
    _ops.allgather_(ins, outs)
    return outs


all_gather = allgather


def reduce_scatter(inputs: Sequence[torch.Tensor], outputs: Optional[Sequence[torch.Tensor]] = None,
                   op: Any = ReduceOp.SUM) -> list:
    """outputs[i] = op over all inputs of their i-th of n equal slices
    (inputs[j].numel() == n * outputs[i].numel()). Default outputs have shape
    (inputs[0].size(0) / n, ...) when that divides, else are flat."""
    ins = _args.tensor_list("reduce_scatter", "inputs", inputs)
    opv = _args.op_value("reduce_scatter", op)
    n = len(ins)
    if outputs is None:
        numel = ins[0].numel()
        if numel % n:
            raise ValueError(f"fastpar.reduce_scatter: inputs[0] has {numel} elements, which is not divisible "
                             f"by len(inputs) = {n}")
        if ins[0].dim() and ins[0].size(0) % n == 0:
            shape = [ins[0].size(0) // n, *ins[0].shape[1:]]
        else:
            shape = [numel // n]
        outs = [torch.empty(shape, dtype=t.dtype, device=t.device) for t in ins]
    else:
        outs = _args.tensor_list("reduce_scatter", "outputs", outputs)
        _args.same_length("reduce_scatter", "outputs", outs, "inputs", ins)
    _ops.reduce_scatter_(ins, outs, opv)
    return outs


def _buckets(tensors: Sequence[torch.Tensor], buffer_size: int) -> List[List[int]]:
    """Indices of ``tensors`` grouped into runs of one dtype and at most
    ``buffer_size`` bytes (a tensor larger than that gets a bucket alone)."""
    if not isinstance(buffer_size, int) or buffer_size <= 0:
        raise ValueError(f"fastpar: buffer_size is {buffer_size!r}; it must be a positive int (bytes)")
    buckets: List[List[int]] = []
    by_dtype: dict = {}
    for j, t in enumerate(tensors):
        if t.is_sparse:
            raise TypeError(f"fastpar: tensors[{j}] is sparse; coalesced ops take dense tensors")
        cur = by_dtype.get(t.dtype)
        nbytes = t.numel() * t.element_size()
        if cur is None or (cur[1] + nbytes > buffer_size and cur[0]):
            cur = [[], 0]
            by_dtype[t.dtype] = cur
            buckets.append(cur[0])
        cur[0].append(j)
        cur[1] += nbytes
    return buckets
