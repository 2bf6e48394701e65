"""Design check for fastpar.DataParallel: persistent replicas vs rebuilding
them every forward (nn.DataParallel's design), and sequential vs threaded
replicas on CPU devices. Every variant trains the same model on the same
batches, and its parameters are compared with single-device training at the
end (last column), so only correct designs are compared.

    .venv/bin/python benchmarks/bench_data_parallel.py                  # 2 CPU devices
    .venv/bin/python benchmarks/bench_data_parallel.py --devices 4 --csv bench_out/dp.csv
    .venv/bin/python benchmarks/bench_data_parallel.py --model deep_mlp --batch 32   # wrapper overhead

Variants (all use fastpar collectives):
  single device      the module alone on the whole batch (baseline)
  persistent         fastpar.DataParallel as shipped: replicas kept, values
                     refreshed in place, one reduce of flat gradient buffers
  persistent+threads the same with CPU replicas run in threads
  rebuild            nn.DataParallel's design: Module replicas rebuilt each
                     forward, parameters broadcast by an autograd function
                     whose backward reduce-adds the gradients

After `bash scripts/setup.sh` run them with .venv/bin/python; any other Python
with torch needs PYTHONPATH=. and an in-place build (setup.py build_ext --inplace).
"""
import argparse
import csv
import os
import statistics
import time

import torch
import torch.nn.functional as F

import fastpar
from fastpar import _nested, data_parallel
from fastpar.lenet import lenet


class _BroadcastParams(torch.autograd.Function):
    """Parameters -> one copy per device (device-major); backward sums the copies' gradients."""

    @staticmethod
    def forward(ctx, devices, *params):
        ctx.n, ctx.src = len(params), params[0].device
        per_param = [fastpar.broadcast(p, devices) for p in params]
        return tuple(per_param[i][d] for d in range(len(devices)) for i in range(len(params)))

    @staticmethod
    def backward(ctx, *grads):
        n, k = ctx.n, len(grads) // ctx.n
        out = []
        for i in range(n):
            gs = [grads[d * n + i] for d in range(k)]
            ref = next(g for g in gs if g is not None)
            gs = [torch.zeros_like(ref) if g is None else g.contiguous() for g in gs]
            out.append(fastpar.reduce_add(gs, ctx.src))
        return (None, *out)


def replicate(network, devices):
    """Module copies sharing nothing but code, whose parameters are autograd copies of the master's."""
    params, buffers = list(network.parameters()), list(network.buffers())
    copies = _BroadcastParams.apply(devices, *params)
    buffer_copies = [fastpar.broadcast(b, devices) for b in buffers]
    modules = list(network.modules())
    index = {id(m): i for i, m in enumerate(modules)}
    pidx = {id(p): k for k, p in enumerate(params)}
    bidx = {id(b): k for k, b in enumerate(buffers)}
    out = []
    for d in range(len(devices)):
        reps = [m._replicate_for_data_parallel() for m in modules]
        for m, rep in zip(modules, reps):
            for key, child in m._modules.items():
                rep._modules[key] = None if child is None else reps[index[id(child)]]
            for key, p in m._parameters.items():
                rep._parameters[key] = None if p is None else copies[d * len(params) + pidx[id(p)]]
            for key, b in m._buffers.items():
                rep._buffers[key] = None if b is None else buffer_copies[bidx[id(b)]][d]
        out.append(reps[0])
    return out


class RebuildEachForward(torch.nn.Module):
    def __init__(self, module, devices):
        super().__init__()
        self.module, self.devices = module, [torch.device(d) for d in devices]

    def forward(self, x):
        sizes = _nested.balanced_chunk_sizes(x.size(0), len(self.devices))
        devs = self.devices[: len(sizes)]
        reps = replicate(self.module, devs)
        chunks = _nested.scatter_nested(x, devs, sizes, 0)
        return _nested.gather_nested([r(c) for r, c in zip(reps, chunks)], sizes, devs[0], 0, "weighted_mean")


def _threaded_cpu_apply(replicas, args, devices):
    import threading
    results = [None] * len(replicas)
    grad = torch.is_grad_enabled()

    def work(i):
        with torch.set_grad_enabled(grad):
            a, kw = args[i]
            results[i] = replicas[i](*a, **kw)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(replicas))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def deep_mlp():
    """Little compute, many modules: the per-step cost of the wrapper itself shows."""
    layers = [torch.nn.Flatten(), torch.nn.Linear(28 * 28, 64)]
    for _ in range(12):
        layers += [torch.nn.ReLU(), torch.nn.Linear(64, 64)]
    return torch.nn.Sequential(*layers, torch.nn.ReLU(), torch.nn.Linear(64, 10))


MODELS = {"lenet": lenet, "deep_mlp": deep_mlp}


def make_variant(name, devices, model_name):
    torch.manual_seed(0)
    net = MODELS[model_name]()
    if name == "single device":
        return net, net
    if name == "rebuild":
        return RebuildEachForward(net, devices), net
    return fastpar.DataParallel(net, device_ids=devices), net


def run_interleaved(names, devices, batches, timed, model_name):
    """One step of every variant in turn, so that load from other processes hits them alike."""
    setups = {}
    for n in names:
        model, net = make_variant(n, devices, model_name)
        setups[n] = (model, net, torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9))
    times = {n: [] for n in names}
    original = data_parallel._parallel_apply
    for i, (x, y) in enumerate(batches):
        for n in names:
            model, net, opt = setups[n]
            data_parallel._parallel_apply = _threaded_cpu_apply if n == "persistent+threads" else original
            try:
                start = time.perf_counter()
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
                if i >= len(batches) - timed:
                    times[n].append(time.perf_counter() - start)
            finally:
                data_parallel._parallel_apply = original
    # min over steps: the machine is shared, and load from other processes only ever adds time
    return {n: (setups[n][1], min(times[n]), statistics.median(times[n])) for n in names}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, default=2, help="number of CPU devices")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--model", choices=sorted(MODELS), default="lenet",
                    help="lenet (compute-bound) or deep_mlp (27 modules, little compute: shows wrapper overhead)")
    ap.add_argument("--csv", default=None)
    args = ap.parse_args()
    devices = ["cpu"] * args.devices
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(args.batch, 1, 28, 28, generator=g), torch.randint(0, 10, (args.batch,), generator=g))
               for _ in range(args.steps)]
    names = ["single device", "persistent", "persistent+threads", "rebuild"]
    results = run_interleaved(names, devices, batches, args.steps // 2, args.model)
    ref = list(results["single device"][0].parameters())
    base, base_med = results["single device"][1], results["single device"][2]
    print(f"{args.model}, batch {args.batch}, {args.devices} CPU devices, torch threads {torch.get_num_threads()}, "
          f"best and median of the last {args.steps // 2} of {args.steps} steps, variants interleaved step by step")
    print(f"{'variant':<20} {'best ms':>8} {'vs single':>10} {'median ms':>10} {'vs single':>10} "
          f"{'max |param diff| vs single':>28}")
    rows = []
    for n in names:
        net, t, med = results[n]
        diff = max((p - q).abs().max().item() for p, q in zip(net.parameters(), ref))
        print(f"{n:<20} {1000 * t:>8.2f} {base / t:>9.3f}x {1000 * med:>10.2f} {base_med / med:>9.3f}x {diff:>28.2e}")
        rows.append({"variant": n, "best_ms_per_step": 1000 * t, "best_speed_vs_single": base / t,
                     "median_ms_per_step": 1000 * med, "median_speed_vs_single": base_med / med,
                     "max_param_diff": diff})
    if args.csv:
        os.makedirs(os.path.dirname(os.path.abspath(args.csv)), exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
