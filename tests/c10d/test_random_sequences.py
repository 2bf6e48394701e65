"""Long random sequences of collectives on one CPU fastpar world, against a
reference. The per-collective tests show each call right on a fresh group;
these show what one call leaves behind for the next: slots and sequence
numbers, recycled Work objects, the placement measurement, subgroups over
the same ranks, the scratch copies of strided tensors, registered memory
coming and going.

Every rank draws the same sequence from a seed: collective, dtype (bool and
complex too), op (the bitwise ones too), size (empty to past the pipelining
threshold), group, root, strided or contiguous tensors, sync or async. Each
rank checks its own results against torch; async calls are waited in an
order of the rank's own, a few calls later. A failure names the step (and
the test's id the seed). FASTPAR_TEST_SOAK=FIRST-LAST runs many more seeds
(test_soak)."""
from __future__ import annotations

import os

import pytest

from dist_harness import assert_ok, run, scenario
from random_calls import make_groups, run_sequence
from worker_context import ARGS, RANK, finish, init

pytestmark = pytest.mark.usefixtures("no_leftover_segments")


@scenario
def sc_random_sequence():
    """ARGS: seed, steps[, "hosts"]. The world, two overlapping subgroups
    and a singleton. "hosts": the ranks sit on several (fake) hosts, where
    registered memory does not apply."""
    seed, steps = int(ARGS[0]), int(ARGS[1])
    one_host = "hosts" not in ARGS[2:]
    init()
    run_sequence(seed, steps, make_groups(), one_host)
    print(f"rank {RANK}: {steps} steps of seed {seed} ok", flush=True)
    finish()


SMALL_SLOTS = {"FASTPAR_SHM_SLOT_BYTES": "4096", "FASTPAR_SHM_P2P_CHUNK_BYTES": "256",
               "FASTPAR_SHM_REGISTERED_MIN_BYTES": "0"}


@pytest.mark.parametrize("world,seed,hosts,env", [
    (2, 1, None, SMALL_SLOTS),
    (3, 2, None, {**SMALL_SLOTS, "FASTPAR_SHM_PLACEMENT": "far"}),
    (4, 3, None, {"FASTPAR_SHM_ONESHOT_MAX_BYTES": "0", "FASTPAR_SHM_P2P_CHUNK_BYTES": "64"}),
    (4, 4, "ABAB", {**SMALL_SLOTS, "FASTPAR_HOSTS_ALLREDUCE": "sharded"}),
    (3, 5, "AAB", {**SMALL_SLOTS, "FASTPAR_HOSTS_ALLREDUCE": "leaders"}),
], ids=["2-seed1", "3-far-seed2", "4-two-shot-seed3", "4-hosts-ABAB-sharded-seed4", "3-hosts-AAB-leaders-seed5"])
def test_random_sequence(world, seed, hosts, env):
    """150 calls per rank; the fake hosts get their ids from FASTPAR_HOST_ID."""
    steps = 150
    per_rank_env = (lambda r: {"FASTPAR_HOST_ID": f"host-{hosts[r]}"}) if hosts else None
    results = run(sc_random_sequence, world, timeout=300, env=env, per_rank_env=per_rank_env,
                  args=(seed, steps) + (("hosts",) if hosts else ()))
    assert_ok(results)
    for r in results:
        assert f"rank {r.rank}: {steps} steps of seed {seed} ok" in r.out



@pytest.mark.skipif("FASTPAR_TEST_SOAK" not in os.environ, reason="a soak, run on demand: FASTPAR_TEST_SOAK=FIRST-LAST")
def test_soak():
    """Many more sequences than the suite runs (FASTPAR_TEST_SOAK=100-139,
    FASTPAR_TEST_SOAK_STEPS, default 300; pytest -s shows a line per seed):
    seed s on 2 + (s // 2) % 4 ranks, odd seeds on fake hosts (the layouts
    in turn, sharded and leaders in turn), five knob settings in turn."""
    first, last = (int(v) for v in os.environ["FASTPAR_TEST_SOAK"].split("-"))
    steps = int(os.environ.get("FASTPAR_TEST_SOAK_STEPS", "300"))
    settings = [SMALL_SLOTS, {}, {"FASTPAR_SHM_SLOT_BYTES": "1024", "FASTPAR_SHM_PLACEMENT": "far"},
                {"FASTPAR_SHM_ALLREDUCE": "two_shot", "FASTPAR_SHM_SLOT_BYTES": "8192"},
                {"FASTPAR_SHM_ONESHOT_MAX_BYTES": "0", "FASTPAR_SHM_P2P_CHUNK_BYTES": "64"}]
    layouts = {2: ["AB"], 3: ["AAB", "ABA", "ABC"], 4: ["AABB", "ABAB", "AAAB", "ABCD"], 5: ["AABBC", "ABABA"]}
    failed = []
    for seed in range(first, last + 1):
        world, env, args, per_rank_env, hosts = 2 + (seed // 2) % 4, dict(settings[seed % 5]), [seed, steps], None, "-"
        if seed % 2:
            hosts = layouts[world][(seed // 16) % len(layouts[world])]
            env["FASTPAR_HOSTS_ALLREDUCE"] = "sharded" if (seed // 8) % 2 else "leaders"
            per_rank_env = lambda r, hosts=hosts: {"FASTPAR_HOST_ID": f"host-{hosts[r]}"}  # noqa: E731
            args.append("hosts")
        results = run(sc_random_sequence, world, timeout=900, env=env, per_rank_env=per_rank_env, args=args)
        bad = [r for r in results if r.rc != 0]
        print(f"seed {seed}: {world} ranks, hosts {hosts}, {env}: {'FAILED' if bad else 'ok'}", flush=True)
        for r in bad:
            print(f"--- rank {r.rank} (exit {r.rc})\n{r.err[-3000:]}", flush=True)
        if bad:
            failed.append(seed)
    assert not failed, f"seeds that failed: {failed}"
