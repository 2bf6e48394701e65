"""A peer SIGKILLed at a random call of a random sequence of collectives
(random_calls.py: every collective, dtype and op, subgroups, strided tensors,
sync and async, one host or fake hosts), with calls of its own and of its
peers still in flight. test_faults.py kills a peer inside a stream of one
collective; this kills it wherever the sequence happens to be.

Every survivor goes on with the sequence. Each call must either complete with
the right result or raise DistBackendError; then the survivor meets the
others at a world barrier (which raises: the victim is in it) and destroys
its group. Checked: no other exception, no wrong result, nothing left in
/dev/shm, and
  * on one host, every survivor done within seconds of the death, although
    the groups' timeout is a minute: it learns of the death, it does not
    wait it out;
  * on fake hosts, every call done within the timeout. A survivor whose
    group has failed goes on to its next call, and its peers on other hosts
    that wait for it in a gloo call between hosts learn nothing until gloo
    times out: a gloo group cannot be aborted (docs/hosts.md).
FASTPAR_TEST_SOAK runs many more seeds (test_soak)."""
from __future__ import annotations

import os
import random
import re
import signal
import time

import pytest
import torch.distributed as dist

from dist_harness import run, scenario
from random_calls import draw, issue, make_groups
from worker_context import ARGS, RANK, finish, init

pytestmark = pytest.mark.usefixtures("no_leftover_segments")

# One host: the groups' timeout, long so that a survivor that waits it out
# shows, and how long after the death every survivor must be done.
TIMEOUT_S = 60
LIVENESS_S = 10
# Fake hosts: the groups' timeout, which bounds each call.
HOSTS_TIMEOUT_S = 10


@scenario
def sc_random_death():
    """ARGS: seed, steps, victim, death step, group timeout (s)[, "hosts"].
    The victim prints when it dies; a survivor prints when it is done, how
    many of its calls raised and the first error."""
    seed, steps, victim, death, timeout_s = (int(a) for a in ARGS[:5])
    one_host = "hosts" not in ARGS[5:]
    init(timeout_s=timeout_s)
    groups = make_groups(timeout_s)
    rng = random.Random(seed)
    mine = random.Random(seed * 1000 + RANK)
    pending: list = []
    raised: list[tuple[int, str]] = []
    longest = 0.0

    def attempt(step: int, fn) -> None:
        nonlocal longest
        t0 = time.monotonic()
        try:
            fn()
        except dist.DistBackendError as e:
            raised.append((step, str(e).splitlines()[0]))
        longest = max(longest, time.monotonic() - t0)

    for step in range(steps):
        c = draw(rng, groups, one_host)
        if RANK == victim and step == death:
            print(f"killed at {time.time():.3f}, step {step}, {len(pending)} calls in flight", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        ranks, group = groups[c.group]
        if RANK in ranks:
            attempt(step, lambda: issue(c, step, ranks, group, pending))
        if pending and mine.random() < 0.4:
            mine.shuffle(pending)
            for work, verify in pending:
                attempt(step, lambda: (work.wait(), verify()))
            pending.clear()
    for work, verify in pending:
        attempt(steps, lambda: (work.wait(), verify()))
    attempt(steps, dist.barrier)
    first = f"step {raised[0][0]}: {raised[0][1]}" if raised else "none"
    print(f"rank {RANK}: done at {time.time():.3f}; {len(raised)} calls raised; longest call {longest:.2f} s; "
          f"first: {first}", flush=True)
    finish()


def _run_death(world: int, seed: int, hosts: str | None, steps: int = 60):
    """Runs one seed: the victim and its step drawn from the seed. Returns
    (results, victim, a description for failures)."""
    pick = random.Random(seed)
    victim, death = pick.randrange(world), pick.randrange(5, steps - 5)
    per_rank_env = (lambda r: {"FASTPAR_HOST_ID": f"host-{hosts[r]}"}) if hosts else None
    timeout_s = HOSTS_TIMEOUT_S if hosts else TIMEOUT_S
    results = run(sc_random_death, world, timeout=4 * timeout_s + 60, per_rank_env=per_rank_env,
                  env={"FASTPAR_SHM_SLOT_BYTES": "4096", "FASTPAR_SHM_P2P_CHUNK_BYTES": "256"},
                  args=(seed, steps, victim, death, timeout_s) + (("hosts",) if hosts else ()))
    every = "\n".join(f"--- rank {r.rank} rc={r.rc}\n{r.out}\n{r.err[-3000:]}" for r in results)
    about = (f"seed {seed}: {world} ranks, hosts {hosts or '-'}, timeout {timeout_s} s, rank {victim} killed at "
             f"step {death}\n{every}")
    return results, victim, about


def _check_death(results, victim: int, about: str, hosts: bool) -> tuple[float, float]:
    """Asserts what the module docstring says; returns the slowest
    survivor's time from the death to its end and the longest call (s)."""
    dead = results[victim]
    assert dead.rc == -signal.SIGKILL, about
    killed_at = float(re.search(r"killed at ([\d.]+)", dead.out).group(1))
    slowest = longest = 0.0
    for r in results:
        if r.rank == victim:
            continue
        assert r.rc == 0, about
        m = re.search(rf"rank {r.rank}: done at ([\d.]+); (\d+) calls raised; longest call ([\d.]+) s", r.out)
        assert m, about
        # The world barrier holds the victim: every survivor raised at least there.
        assert int(m.group(2)) >= 1, about
        slowest = max(slowest, float(m.group(1)) - killed_at)
        longest = max(longest, float(m.group(3)))
    if hosts:
        assert longest < HOSTS_TIMEOUT_S + 5, f"a call took {longest:.1f} s\n{about}"
    else:
        assert slowest < LIVENESS_S, f"a survivor took {slowest:.1f} s after the death\n{about}"
    return slowest, longest


@pytest.mark.parametrize("world,seed,hosts", [
    (2, 11, None), (3, 12, None), (4, 13, None), (4, 14, "AABB"), (3, 15, "ABA"),
], ids=["2-seed11", "3-seed12", "4-seed13", "4-hosts-AABB-seed14", "3-hosts-ABA-seed15"])
def test_random_death(world, seed, hosts):
    results, victim, about = _run_death(world, seed, hosts)
    _check_death(results, victim, about, bool(hosts))


@pytest.mark.skipif("FASTPAR_TEST_SOAK" not in os.environ, reason="a soak, run on demand: FASTPAR_TEST_SOAK=FIRST-LAST")
def test_soak():
    """Many more seeds (FASTPAR_TEST_SOAK=100-139; pytest -s shows a line per
    seed): seed s on 2 + s % 4 ranks, odd seeds on fake hosts."""
    first, last = (int(v) for v in os.environ["FASTPAR_TEST_SOAK"].split("-"))
    layouts = {2: "AB", 3: "AAB", 4: "ABAB", 5: "AABBC"}
    failed = []
    for seed in range(first, last + 1):
        world = 2 + seed % 4
        hosts = layouts[world] if seed % 2 else None
        results, victim, about = _run_death(world, seed, hosts)
        try:
            slowest, longest = _check_death(results, victim, about, bool(hosts))
            print(f"seed {seed}: {world} ranks, hosts {hosts or '-'}: ok, survivors done {slowest:.1f} s after the "
                  f"death, longest call {longest:.1f} s", flush=True)
        except AssertionError as e:
            print(f"seed {seed}: FAILED\n{e}", flush=True)
            failed.append(seed)
    assert not failed, f"seeds that failed: {failed}"
