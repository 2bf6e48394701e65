"""What programs call in torch.distributed besides DDP's own collectives:
functional collectives (eagerly and under torch.compile), a compiled DDP
model, the autograd-aware collectives, subgroups with periodic model
averaging, receives from any source and group-relative ranks, Work futures,
and every dtype x reduce op x reducing collective that gloo takes (bool
flags, bitwise ops, complex tensors): each call gloo runs must run on fastpar
and give its results."""
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed.nn.functional as autograd_dist
import torch.nn as nn
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.nn.parallel import DistributedDataParallel as DDP

from client_common import RANK, WORLD, run_both


def functional(backend: str) -> dict:
    g = dist.group.WORLD
    x = torch.arange(8, dtype=torch.float32) + RANK
    out = {"all_reduce": funcol.all_reduce(x, "sum", g), "all_gather": funcol.all_gather_tensor(x, 0, g),
           "reduce_scatter": funcol.reduce_scatter_tensor(x, "sum", 0, g),
           "all_to_all": funcol.all_to_all_single(x, None, None, g), "broadcast": funcol.broadcast(x, 1, g)}
    out = {k: funcol.wait_tensor(v).clone() for k, v in out.items()}

    @torch.compile(backend="aot_eager", fullgraph=True)
    def step(y):
        return funcol.all_reduce(y * 2, "max", g) + 1

    out["compiled"] = step(x)
    return out


def compiled_ddp(backend: str) -> dict:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    model = torch.compile(DDP(net), backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(RANK)
    for _ in range(2):
        model(torch.randn(4, 8, generator=g)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return {"params": [p.detach().clone() for p in net.parameters()]}


def autograd_collectives(backend: str) -> dict:
    x = (torch.arange(4, dtype=torch.float32) + RANK).requires_grad_()
    y = autograd_dist.all_reduce(x * 3, group=dist.group.WORLD)
    z = torch.stack(autograd_dist.all_gather(x, group=dist.group.WORLD)).sum()
    (y.sum() + z).backward()
    return {"y": y.detach(), "grad": x.grad.clone()}


def subgroups_and_averaging(backend: str) -> dict:
    mine, _ = dist.new_subgroups(group_size=1)
    t = torch.ones(3) * (RANK + 1)
    dist.all_reduce(t, group=mine)
    torch.manual_seed(RANK)
    m = nn.Linear(4, 2)
    m(torch.ones(1, 4)).sum().backward()
    PeriodicModelAverager(period=1, warmup_steps=0).average_parameters(list(m.parameters()))
    return {"alone": t, "averaged": [p.detach().clone() for p in m.parameters()]}


def point_to_point(backend: str) -> dict:
    out = {}
    t = torch.zeros(3)
    if RANK == 0:
        out["sender"] = dist.recv(t)  # any source: the sender's rank comes back
        work = dist.irecv(t)
        work.wait()
        out["sender2"] = work._source_rank()
        out["t"] = t
    elif RANK == 1:
        dist.send(torch.ones(3) * 5, 0)
        dist.send(torch.ones(3) * 6, 0)
    pair = dist.new_group([0, 1])
    if RANK == 0:
        dist.send(torch.ones(2) * 7, group=pair, group_dst=1)
    elif RANK == 1:
        x = torch.zeros(2)
        dist.recv(x, group=pair, group_src=0)
        out["x"] = x
    work = dist.all_reduce(torch.ones(5) * (RANK + 1), async_op=True)
    out["future"] = work.get_future().then(lambda f: f.value()[0] * 2).wait()
    return out


DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float32, torch.float64,
          torch.float16, torch.bfloat16, torch.complex64, torch.complex128]
OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
_GLOO_RAN: set = set()  # the (dtype, op, collective) cases gloo ran: fastpar must run each


def reductions(backend: str) -> dict:
    results = {}
    for dtype in DTYPES:
        # gloo reports other ops on complex tensors only at the next call, so none is tried
        for op in (OPS[:2] if dtype.is_complex else OPS):
            for coll in ("all_reduce", "reduce", "reduce_scatter_tensor"):
                case = (str(dtype), op, coll)
                if backend != "gloo" and case not in _GLOO_RAN:
                    continue
                t = (torch.arange(6) % 3 + RANK).to(dtype)
                rop = getattr(dist.ReduceOp, op)
                try:
                    if coll == "all_reduce":
                        dist.all_reduce(t, op=rop)
                    elif coll == "reduce":
                        dist.reduce(t, 0, op=rop)
                    else:
                        o = torch.empty(6 // WORLD, dtype=dtype)
                        dist.reduce_scatter_tensor(o, t, op=rop)
                        t = o
                except Exception as e:  # noqa: BLE001  gloo refuses many: those are not compared
                    if backend == "gloo":
                        continue
                    results[case] = f"{type(e).__name__}: {e}"
                    continue
                _GLOO_RAN.add(case)
                if coll != "reduce" or RANK == 0:  # gloo leaves scratch values in the others' inputs
                    results[case] = t
    return results


if __name__ == "__main__":
    run_both(functional, "functional collectives, eager and compiled")
    run_both(compiled_ddp, "a compiled DDP model")
    run_both(autograd_collectives, "the autograd-aware collectives")
    run_both(subgroups_and_averaging, "new_subgroups and PeriodicModelAverager")
    run_both(point_to_point, "any-source receives, group ranks and futures")
    results = run_both(reductions, "every reduction gloo runs")
    assert len(results["gloo"]) > 100, len(results["gloo"])
