"""fastpar.DistributedDataParallel and fastpar.comm_hook against single-process
training on the global batch. One spawn per (backend, world size) runs every
scenario, because starting processes dominates the cost on small machines."""
import gc
import os
import tempfile
import weakref

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

import fastpar

STEPS = 3


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def global_batches(sizes, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(b, 6, generator=g), torch.randint(0, 4, (b,), generator=g)) for b in sizes]


def shard(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Balanced contiguous split (13 over 3 ranks: 5, 4, 4)."""
    n = t.size(0)
    sizes = [n // world + (1 if r < n % world else 0) for r in range(world)]
    return t.narrow(0, sum(sizes[:rank]), sizes[rank])


def loss_fn(out, y, n_global, world):
    # Sum over local samples scaled by world / n_global: after DDP's average over
    # ranks this is exactly the mean loss over the global batch, even when uneven.
    return F.cross_entropy(out, y, reduction="sum") * world / n_global


def train(model, opt, data, rank, world, no_sync_first=False):
    for x, y in data:
        opt.zero_grad()
        xs, ys = shard(x, rank, world), shard(y, rank, world)
        if no_sync_first:  # two micro-batches: the first accumulates locally
            half = xs.size(0) // 2
            with model.no_sync():
                loss_fn(model(xs[:half]), ys[:half], x.size(0), world).backward()
            loss_fn(model(xs[half:]), ys[half:], x.size(0), world).backward()
        else:
            loss_fn(model(xs), ys, x.size(0), world).backward()
        opt.step()


def snapshot(model):
    return [p.detach().clone() for p in model.parameters()]


class Branchy(nn.Module):
    """`rank0_only` is used by rank 0 alone, `never` by no rank."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.trunk = nn.Linear(6, 4)
        self.rank0_only = nn.Linear(4, 4)
        self.never = nn.Linear(4, 4)

    def forward(self, x, use_branch):
        h = self.trunk(x)
        return self.rank0_only(h) if use_branch else h


def grads_in_buckets(model) -> dict:
    """For each parameter, whether its .grad lies inside its bucket's flat
    tensor (a view of the bucket, not a copy)."""
    inside = {}
    for b in model.buckets:
        lo = b.flat.data_ptr()
        hi = lo + b.flat.numel() * b.flat.element_size()
        for name, p in zip(b.names, b.params):
            g = p.grad
            inside[name] = g is not None and lo <= g.data_ptr() and g.data_ptr() + g.numel() * g.element_size() <= hi
    return inside


def worker(rank, world, backend, store_path, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group(backend, store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    results = {}
    data = global_batches([12, 13, 7, 12][:STEPS + 1])

    for name, kwargs in [("fastpar", {}), ("fastpar_bucket_view", {"gradient_as_bucket_view": True})]:
        net = make_model()
        if rank == world - 1:
            with torch.no_grad():
                net[0].weight.add_(1.0)  # construction must broadcast rank 0's values
        model = fastpar.DistributedDataParallel(net, bucket_cap_mb=0.002, **kwargs)  # several buckets
        results[name + "_buckets"] = len(model.buckets)
        results["bucket_storage"] = model.bucket_storage_kind
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        train(model, opt, data, rank, world)
        results[name] = snapshot(net)
        results[name + "_grads_in_buckets"] = grads_in_buckets(model)
        results["launched_from_hooks"] = model.launched_from_hooks

    net = make_model()
    model = fastpar.DistributedDataParallel(net, bucket_cap_mb=0.002)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train(model, opt, data, rank, world, no_sync_first=True)
    results["no_sync"] = snapshot(net)

    net = make_model()
    stock = nn.parallel.DistributedDataParallel(net)
    stock.register_comm_hook(None, fastpar.comm_hook)
    opt = torch.optim.SGD(stock.parameters(), lr=0.1, momentum=0.9)
    train(stock, opt, data, rank, world)
    results["comm_hook"] = snapshot(net)

    x, _ = global_batches([4 * world], seed=7)[0]
    branchy = Branchy()
    model = fastpar.DistributedDataParallel(branchy, find_unused_parameters=True)
    model(shard(x, rank, world), rank == 0).sum().backward()
    results["unused_grads"] = {n: (None if p.grad is None else p.grad.clone())
                               for n, p in branchy.named_parameters()}

    model = fastpar.DistributedDataParallel(Branchy(), find_unused_parameters=False)
    try:
        model(shard(x, rank, world), False).sum().backward()
        results["unused_error"] = None
    except RuntimeError as e:
        results["unused_error"] = str(e)
    # A dropped wrapper goes at once, with its buckets and their Works, and
    # leaves no hook on the module it wrapped.
    wrapper, module = weakref.ref(model), model.module
    del model
    gc.collect()
    results["wrapper_freed"] = wrapper() is None
    results["hooks_left"] = sum(len(p._post_accumulate_grad_hooks or ()) for p in module.parameters())
    results["backend"] = backend
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()  # no rank closes its connections while a peer's last collective still runs
    dist.destroy_process_group()


def run_world(world, backend):
    out_dir = tempfile.mkdtemp(prefix="fastpar_ddp_")
    store = os.path.join(out_dir, "store")
    mp.start_processes(worker, args=(world, backend, store, out_dir), nprocs=world, start_method="spawn")
    return [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(world)]


def reference(world, no_sync_first=False):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in global_batches([12, 13, 7, 12][:STEPS + 1]):
        opt.zero_grad()
        if no_sync_first:  # the same micro-batches, all in one process
            for r in range(world):
                xs, ys = shard(x, r, world), shard(y, r, world)
                half = xs.size(0) // 2
                (loss_fn(model(xs[:half]), ys[:half], x.size(0), world) / world).backward()
                (loss_fn(model(xs[half:]), ys[half:], x.size(0), world) / world).backward()
        else:
            F.cross_entropy(model(x), y).backward()
        opt.step()
    return snapshot(model)


_SESSIONS = [
    pytest.param((2, "gloo"), id="world2-gloo"),
    pytest.param((3, "gloo"), id="world3-gloo"),
    pytest.param((2, "fastpar"), id="world2-fastpar"),
]


@pytest.fixture(scope="module", params=_SESSIONS)
def session(request):
    world, backend = request.param
    return world, run_world(world, backend)


@pytest.mark.parametrize("scenario", ["fastpar", "fastpar_bucket_view", "no_sync", "comm_hook"])
def test_matches_single_process_on_the_global_batch(session, scenario):
    world, results = session
    ref = reference(world, no_sync_first=scenario == "no_sync")
    for rank, res in enumerate(results):
        for i, (p, q) in enumerate(zip(res[scenario], ref)):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"rank {rank} parameter {i}: {m}")
        if scenario.startswith("fastpar"):
            # gradient_as_bucket_view: every .grad is a view into its bucket;
            # without it, every .grad is a tensor of its own
            bucket_view = scenario == "fastpar_bucket_view"
            inside = res[scenario + "_grads_in_buckets"]
            assert inside and all(v == bucket_view for v in inside.values()), (rank, inside)


@pytest.mark.parametrize("scenario", ["fastpar", "fastpar_bucket_view", "no_sync", "comm_hook"])
def test_every_rank_holds_identical_bits(session, scenario):
    _, results = session
    for rank, res in enumerate(results[1:], start=1):
        for i, (p, q) in enumerate(zip(res[scenario], results[0][scenario])):
            assert torch.equal(p, q), f"rank {rank} parameter {i} differs from rank 0"


def test_buckets_live_in_registered_memory_exactly_on_the_fastpar_backend(session):
    _, results = session
    for res in results:
        expected = "registered" if res["backend"] == "fastpar" else "torch.empty"
        assert res["bucket_storage"] == expected


def test_small_bucket_cap_gives_several_buckets_launched_during_backward(session):
    _, results = session
    for res in results:
        assert res["fastpar_bucket_view_buckets"] >= 3
        # every bucket went out from a gradient hook, before backward had finished
        assert res["launched_from_hooks"] == res["fastpar_bucket_view_buckets"]


def test_find_unused_parameters_averages_what_some_rank_used(session):
    world, results = session
    x, _ = global_batches([4 * world], seed=7)[0]
    ref = Branchy()
    total = sum(ref(shard(x, r, world), r == 0).sum() for r in range(world)) / world
    total.backward()
    for res in results:
        grads = res["unused_grads"]
        assert grads["never.weight"] is None and grads["never.bias"] is None
        torch.testing.assert_close(grads["rank0_only.weight"], ref.rank0_only.weight.grad)
        torch.testing.assert_close(grads["trunk.weight"], ref.trunk.weight.grad)


def test_unused_parameters_without_the_flag_name_them(session):
    _, results = session
    for res in results:
        assert res["unused_error"] is not None
        assert "received no gradient" in res["unused_error"]
        assert "never.weight" in res["unused_error"] and "find_unused_parameters=True" in res["unused_error"]


def test_a_dropped_wrapper_is_freed_and_leaves_no_hooks(session):
    _, results = session
    for rank, res in enumerate(results):
        assert res["wrapper_freed"], f"rank {rank}: the wrapper outlived its last reference"
        assert res["hooks_left"] == 0, f"rank {rank}: {res['hooks_left']} gradient hooks left on the module"


def test_bucket_storage_is_plain_without_the_fastpar_backend():
    from fastpar.bucket_storage import allocate_bucket_storage
    t = allocate_bucket_storage(5, torch.float32, torch.device("cpu"), None)
    assert t.shape == (5,) and t.dtype == torch.float32 and bool((t == 0).all())
