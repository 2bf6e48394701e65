"""fastpar's own cost per dist.all_reduce call, against torch's wrapper cost,
in one process (no peer to wait for, so a loaded machine disturbs it least).

    python benchmarks/bench_call_overhead.py            # 4 KiB float32, 20 rounds

Rows (best of --rounds rounds, every path timed once per round, interleaved):
  direct        fastpar.distributed.all_reduce on a 1-rank fastpar group
  fastpar dist  dist.all_reduce on that group
  fake dist     dist.all_reduce on a group of torch's "fake" backend, which does
                nothing: torch's own cost per call (the baseline)
  fastpar pg    ProcessGroup.allreduce(...).wait() on the fastpar group
  fake pg       the same on the fake group
  list          fastpar.allreduce([a, b]) (one process, two CPU tensors)
  list entry    the op it calls, through the extension's C++ entry
  list torch.ops  the same op through torch.ops.fastpar.allreduce_
fastpar's share = fastpar - fake (dist and pg rows), set against the direct
call; the list op's Python side = list - list entry. bench_latency.py measures
the same with 2 ranks (and their waits).
"""
import argparse
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bytes", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--iters", type=int, default=1000)
    args = p.parse_args()

    import torch
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  registers the "fake" backend

    import fastpar  # registers the backend
    import fastpar.distributed as fd

    torch.set_num_threads(1)
    dist.init_process_group("fastpar", store=dist.HashStore(), rank=0, world_size=1)
    fake, world = dist.new_group(backend="fake"), dist.group.WORLD
    t = torch.ones(max(1, args.bytes // 4))
    opts = dist.AllreduceOptions()
    paths = {"direct": lambda: fd.all_reduce(t),
             "fastpar dist": lambda: dist.all_reduce(t, group=world),
             "fake dist": lambda: dist.all_reduce(t, group=fake),
             "fastpar pg": lambda: world.allreduce([t], opts).wait(),
             "fake pg": lambda: fake.allreduce([t], opts).wait()}
    pair = [t.clone(), t.clone()]
    paths.update({"list": lambda: fastpar.allreduce(pair),
                  "list entry": lambda: fastpar._C._allreduce_(pair, 0, "auto"),
                  "list torch.ops": lambda: torch.ops.fastpar.allreduce_(pair, 0, "auto")})
    best = {k: float("inf") for k in paths}
    for r in range(args.rounds):
        # Alternate the order each round: a path never always follows the same one.
        for k, fn in (list(paths.items()) if r % 2 == 0 else list(paths.items())[::-1]):
            t0 = time.perf_counter()
            for _ in range(args.iters):
                fn()
            best[k] = min(best[k], (time.perf_counter() - t0) / args.iters * 1e6)
    for k, v in best.items():
        print(f"{k:16s} {v:7.2f} us")
    d = best["direct"]
    print(f"fastpar share, dist: {best['fastpar dist'] - best['fake dist']:.2f} us = "
          f"{(best['fastpar dist'] - best['fake dist']) / d:.2f}x direct; pg: "
          f"{best['fastpar pg'] - best['fake pg']:.2f} us = {(best['fastpar pg'] - best['fake pg']) / d:.2f}x direct "
          "(target: at most 1.30x)")
    print(f"list op's Python side: {best['list'] - best['list entry']:.2f} us over its op "
          f"(through torch.ops: {best['list torch.ops'] - best['list entry']:.2f} us; target: at most 1 us)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
