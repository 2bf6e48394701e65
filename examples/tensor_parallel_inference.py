"""CPU tensor-parallel inference of a small transformer stack, one process per rank.

    .venv/bin/python examples/tensor_parallel_inference.py              # 2 ranks (torchrun started for you)
    .venv/bin/torchrun --standalone --nproc_per_node=2 examples/tensor_parallel_inference.py
    .venv/bin/python examples/tensor_parallel_inference.py --quick      # small model, a few seconds

Megatron-style sharding: each rank holds 1/n of every layer's attention heads
and MLP columns; the attention output projection and the MLP down projection
are row-parallel, so each layer ends both halves with an all_reduce of the
(batch x d_model) activations: 2 small all_reduces per layer per token, the
latency-bound pattern CPU inference lives on. Tokens are decoded one at a
time with a KV cache (teacher-forced from a fixed sequence, so every mode
computes the same thing).

Modes, interleaved in the same processes, best of --repeats:
  1 process     the whole model on rank 0 alone (the reference outputs and
                the no-parallelism speed)
  gloo          dist.all_reduce on a gloo group
  fastpar       dist.all_reduce on the fastpar group
  fastpar direct  fastpar.distributed.all_reduce (no torch.distributed wrapper)
Each parallel mode's logits are checked against the 1-process ones.
"""
from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import fastpar.distributed as fd  # importing fastpar registers the "fastpar" backend


def full_weights(cfg) -> dict:
    """The whole model, the same on every rank (seeded)."""
    g = torch.Generator().manual_seed(0)
    d, f = cfg.d_model, cfg.ffn

    def w(*shape):
        return torch.randn(*shape, generator=g) / math.sqrt(shape[-1])

    layers = [dict(wqkv=w(3 * d, d), wo=w(d, d), w1=w(f, d), w2=w(d, f)) for _ in range(cfg.layers)]
    return dict(embed=torch.randn(cfg.vocab, d, generator=g) * 0.1, head=w(cfg.vocab, d), layers=layers)


def shard(full: dict, cfg, rank: int, n: int) -> dict:
    """Rank `rank`'s slice: its heads of wqkv (rows) and wo (columns), its
    columns of w1 (rows) and w2 (columns). Embedding and head are replicated."""
    d, hd = cfg.d_model, cfg.d_model // cfg.heads
    hs = slice(rank * cfg.heads // n * hd, (rank + 1) * cfg.heads // n * hd)
    fs = slice(rank * cfg.ffn // n, (rank + 1) * cfg.ffn // n)
    layers = []
    for L in full["layers"]:
        q, k, v = L["wqkv"].split(d)
        layers.append(dict(wqkv=torch.cat([q[hs], k[hs], v[hs]]).contiguous(), wo=L["wo"][:, hs].contiguous(),
                           w1=L["w1"][fs].contiguous(), w2=L["w2"][:, fs].contiguous()))
    return dict(embed=full["embed"], head=full["head"], layers=layers)


def rmsnorm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def decode(weights: dict, tokens: torch.Tensor, cfg, all_reduce) -> torch.Tensor:
    """Logits for every position of `tokens` (batch x steps), one token per
    step with a KV cache; `all_reduce(t)` sums row-parallel partials in place."""
    hd = cfg.d_model // cfg.heads
    batch, steps = tokens.shape
    cache = [([], []) for _ in weights["layers"]]
    out = []
    for s in range(steps):
        x = weights["embed"][tokens[:, s]]  # batch x d
        for L, (ks, vs) in zip(weights["layers"], cache):
            qkv = rmsnorm(x) @ L["wqkv"].t()
            q, k, v = (t.view(batch, -1, hd) for t in qkv.chunk(3, dim=1))  # batch x local heads x hd
            ks.append(k)
            vs.append(v)
            keys, values = torch.stack(ks, 2), torch.stack(vs, 2)  # batch x heads x time x hd
            att = torch.softmax((keys @ q.unsqueeze(-1)).squeeze(-1) / math.sqrt(hd), dim=-1)
            o = (att.unsqueeze(-2) @ values).reshape(batch, -1)
            y = o @ L["wo"].t()
            all_reduce(y)
            x = x + y
            y = F.gelu(rmsnorm(x) @ L["w1"].t()) @ L["w2"].t()
            all_reduce(y)
            x = x + y
        out.append(rmsnorm(x) @ weights["head"].t())
    return torch.stack(out, 1)


def run(cfg) -> None:
    dist.init_process_group("fastpar")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)  # one core per rank
    gloo = dist.new_group(backend="gloo")
    full = full_weights(cfg)
    mine = shard(full, cfg, rank, n)
    tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.steps), generator=torch.Generator().manual_seed(1))
    modes = {
        "gloo": lambda t: dist.all_reduce(t, group=gloo),
        "fastpar": lambda t: dist.all_reduce(t),
        "fastpar direct": lambda t: fd.all_reduce(t),
    }
    best = {m: float("inf") for m in ["1 process", *modes]}
    logits = {}
    for _ in range(cfg.repeats):
        if rank == 0:  # the whole model, no communication; the others wait
            t0 = time.perf_counter()
            logits["1 process"] = decode(full, tokens, cfg, lambda t: None)
            best["1 process"] = min(best["1 process"], time.perf_counter() - t0)
        dist.barrier(group=gloo)
        for name, ar in modes.items():
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            logits[name] = decode(mine, tokens, cfg, ar)
            dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=gloo)
            best[name] = min(best[name], dt.item())
    if rank == 0:
        ref = logits["1 process"]
        toks = cfg.batch * cfg.steps
        print(f"\n{cfg.layers} layers, d_model {cfg.d_model}, ffn {cfg.ffn}, {cfg.heads} heads, batch {cfg.batch}, "
              f"{cfg.steps} decode steps; {n} ranks; {2 * cfg.layers} all_reduces of "
              f"{cfg.batch * cfg.d_model * 4} bytes per step; best of {cfg.repeats}")
        print(f"{'mode':<16} {'tokens/s':>10} {'vs gloo':>8} {'vs 1 process':>13} {'max |logit diff|':>17}")
        for name, sec in best.items():
            diff = (logits[name] - ref).abs().max().item()
            print(f"{name:<16} {toks / sec:>10.1f} {best['gloo'] / sec:>7.2f}x {best['1 process'] / sec:>12.2f}x "
                  f"{diff:>17.2e}")
            # fp32 partial sums in another order: equal to rounding, far from any real error
            assert diff < 1e-3 * max(1.0, ref.abs().max().item()), f"{name}: logits differ from 1 process by {diff}"
        print("outputs match the 1-process model in every mode")
        if cfg.csv:
            import csv
            os.makedirs(os.path.dirname(os.path.abspath(cfg.csv)), exist_ok=True)
            with open(cfg.csv, "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["mode", "tokens_per_s", "vs_gloo", "vs_1_process", "layers", "d_model", "steps"])
                for name, sec in best.items():
                    w.writerow([name, f"{toks / sec:.2f}", f"{best['gloo'] / sec:.3f}",
                                f"{best['1 process'] / sec:.3f}", cfg.layers, cfg.d_model, cfg.steps])
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2, help="processes, when not started by torchrun")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--ffn", type=int, default=2048)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=64, help="tokens decoded per sequence")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="2 layers, d_model 128, 16 steps, 1 repeat")
    p.add_argument("--csv", default=None, help="write the table to this CSV file")
    cfg = p.parse_args()
    if cfg.quick:
        cfg.layers, cfg.d_model, cfg.ffn, cfg.steps, cfg.repeats = 2, 128, 512, 16, 1
    if cfg.heads % cfg.ranks or cfg.ffn % cfg.ranks or cfg.d_model % cfg.heads:
        p.error(f"--heads ({cfg.heads}) and --ffn ({cfg.ffn}) must divide by --ranks ({cfg.ranks}), "
                f"and --d-model ({cfg.d_model}) by --heads")
    if "RANK" in os.environ:  # started by torchrun
        return run(cfg)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={cfg.ranks}",
           os.path.abspath(__file__), *sys.argv[1:]]
    sys.exit(subprocess.run(cmd, env=env).returncode)


if __name__ == "__main__":
    main()
