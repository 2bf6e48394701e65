"""The near and far schedules of the CPU all_reduce (shm_placement.h): the
same bits as each other and as the reference, forced or measured, plain and
registered tensors; the measurement's report; the drift agreement; the knob."""
import pytest
import torch
import torch.distributed as dist

import fastpar.distributed as fd
from fastpar._C import _testing
from batched_scenarios import InBatch, batched, scenario_result, shapes
from dist_harness import assert_ok, scenario
from reference import DTYPES, exact_data, random_data, reference
from worker_context import ARGS, RANK, WORLD, check, finish, init, ops_for, same_bits_everywhere

pytestmark = pytest.mark.usefixtures("no_leftover_segments")

# With the batch's 4 KiB slots every size here runs the two-shot family
# over 1 to 40 chunks where it is forced, and the first two the one-shot
# where the schedule is the default's.
SIZES = (1, 1000, 40_003)


def _run_all(mode: str) -> dict:
    """Every dtype x op x size, plain and registered, under placement `mode`:
    results by case, each checked against the reference."""
    b = fd.get_fastpar_backend()
    _testing.set_shm_placement(b, mode)
    out = {}
    seed = 0
    for dtype in DTYPES:
        for op in ops_for(dtype):
            for n in SIZES:
                seed += 1
                exact = op != dist.ReduceOp.AVG
                xs = [(exact_data if exact else random_data)(q, n, dtype, seed) for q in range(WORLD)]
                t = xs[RANK].clone()
                dist.all_reduce(t, op=op)
                what = f"{mode}: all_reduce {dtype} {op} n={n}"
                check(t, reference(xs, op), what, exact=exact)
                r = fd.registered_empty((n,), dtype)
                r.copy_(xs[RANK])
                dist.all_reduce(r, op=op)
                assert torch.equal(r, t), f"{what}: registered differs from plain"
                out[(str(dtype), str(op), n)] = t
                del r
    return out


@scenario
def sc_placement_modes():
    """Near, far and measured give the same bits, on every rank; the report
    says what ran."""
    init()
    b = fd.get_fastpar_backend()
    for algo in (2, 0):  # two-shot at every size; the default's schedules (one-shot up to a slot)
        _testing.set_shm_allreduce(b, -1, algo)
        results = {m: _run_all(m) for m in ("near", "far", "auto")}
        for case, t in results["near"].items():
            for m in ("far", "auto"):
                assert torch.equal(results[m][case], t), f"{case}: {m} differs from near (algo {algo})"
        same_bits_everywhere(torch.cat([t.view(torch.uint8).flatten() for t in results["far"].values()]), "far")
    p = fd.placement()
    assert any(k["one_shot"] for k in p["classes"]) and any(not k["one_shot"] for k in p["classes"]), p
    assert p["mode"] == "auto" and p["classes"], p
    for k in p["classes"]:
        assert k["schedule"] in ("near", "far", "measuring") and k["near_us"] > 0 and k["calls"] > 0, p
        assert k["schedule"] == "measuring" or (k["far_us"] > 0 and k["pairs"] >= 8 and k["far_over_near"] > 0), p
    # Every rank took the same decisions from the same numbers.
    got = [None] * WORLD
    decided = [k for k in p["classes"] if k["schedule"] != "measuring"]  # a trial's times are the rank's own
    dist.all_gather_object(got, (decided, p["decisions"], p["checks"], p["calls"]))
    assert all(g == got[0] for g in got), got
    for m in ("near", "far"):
        _testing.set_shm_placement(b, m)
        assert fd.placement()["schedule"] == m and fd.placement()["mode"] == m
    finish()


@pytest.mark.parametrize("device,layout,world", shapes(cpu_worlds=[2, 3, 4], cuda_layouts=[]))
@batched(sc_placement_modes)
def test_near_far_and_measured_give_the_same_bits(request, device, layout, world):
    assert_ok(scenario_result(request))


def _agreed(p):
    """What every rank must hold alike: the decided classes and the counts."""
    return ([k for k in p["classes"] if k["schedule"] != "measuring"], p["decisions"], p["revisits"], p["rechecks"],
            p["checks"], p["calls"])


def _same_everywhere(p):
    got = [None] * WORLD
    dist.all_gather_object(got, _agreed(p))
    assert all(g == got[0] for g in got), got


DELAY_US = 20000.0  # far above a test call's own time and its noise on a heavily loaded machine


def _calls(t, n, until):
    """Up to `n` all_reduce calls of `t` (all ones), until `until` holds for
    the first class; then the report."""
    for _ in range(n):
        t.fill_(1.0)
        dist.all_reduce(t)
        assert torch.all(t == WORLD)
        if until(fd.placement()["classes"][0]):
            break
    return fd.placement()


def _measured_two_shot():
    """Joins the group with every all_reduce on the two-shot and its placement
    measured (auto); the backend, and the 5000-float tensor the scenarios
    below reduce (one size class)."""
    init()
    b = fd.get_fastpar_backend()
    _testing.set_shm_allreduce(b, -1, 2)
    _testing.set_shm_placement(b, "auto")
    return b, torch.ones(5000)


@scenario
def sc_placement_drift():
    """One rank reports drift: at the next check every rank measures again,
    and all take the same decision."""
    b, t = _measured_two_shot()
    _testing.set_shm_placement_delays(b, 0.0, DELAY_US)  # far slower: decided at the first test

    def call():
        t.fill_(1.0)
        dist.all_reduce(t)
        assert torch.all(t == WORLD)

    for _ in range(17):  # 8 pairs of trials (16 calls), then the decision
        call()
    p = fd.placement()
    assert p["decisions"] == 1 and p["calls"] == 17 and len(p["classes"]) == 1, p
    k = p["classes"][0]
    assert (k["min_bytes"], k["schedule"], k["settled"], k["pairs"]) == (16384, "near", True, 8), p
    assert k["far_us"] > k["near_us"] + 0.8 * DELAY_US and k["far_over_near"] > 2, p
    if RANK == int(ARGS[0]):
        _testing.mark_shm_placement_drifted(b)
    for _ in range(31):  # the 32nd large call holds the check: trials again, decided at the 48th
        call()
    # The forced drift made every rank measure again (and any rank's own
    # drift, which a loaded machine can cause, would too): every rank the
    # same count and the same decision.
    p = fd.placement()
    assert p["calls"] == 48 and p["checks"] == 1 and p["decisions"] >= 2, p
    assert p["classes"][0]["schedule"] == "near", p
    for _ in range(16):
        call()
    p = fd.placement()
    assert p["checks"] == 2, p
    _same_everywhere(p)
    # A one-shot call is measured in a class of its own.
    _testing.set_shm_allreduce(b, -1, 0)
    dist.all_reduce(torch.ones(4))
    p = fd.placement()
    assert p["calls"] == 65 and [(k["min_bytes"], k["one_shot"]) for k in p["classes"]] == [(16384, False), (16, True)], p
    _testing.set_shm_placement_delays(b, 0.0, 0.0)
    finish()


@pytest.mark.parametrize("device,layout,world", shapes(cpu_worlds=[2, 3], cuda_layouts=[]))
@batched(lambda p: InBatch(sc_placement_drift, [str(p["world"] - 1)]))
def test_one_ranks_drift_makes_every_rank_measure_again(request, device, layout, world):
    assert_ok(scenario_result(request))


# float32 elements: 1 KiB and 4 KiB (one-shot: one slot), 8 KiB .. 256 KiB
# (two-shot: 2 to 64 chunks of the batch's slots), six size classes.
CLASS_SIZES = (256, 1024, 2048, 8192, 32768, 65536)


@scenario
def sc_placement_slower_form_loses():
    """A form made slower (on every rank, by the test delay) loses in every
    size class a job uses; when the delay moves to the other form the rate
    drifts, every class is measured again and each picks the other form."""
    init()
    b = fd.get_fastpar_backend()
    _testing.set_shm_allreduce(b, -1, 0)
    _testing.set_shm_placement(b, "auto")
    ts = [torch.empty(n) for n in CLASS_SIZES]

    def rounds(count, until):
        """Calls of every size in turn (as a training step's buckets) until
        every class satisfies `until` (agreed state: every rank stops alike)."""
        for i in range(count):
            for t in ts:
                t.fill_(1.0)
                dist.all_reduce(t)
                assert torch.all(t == WORLD)
            p = fd.placement()
            if i >= 24 and len(p["classes"]) == len(ts) and all(until(k) for k in p["classes"]):
                return p
        return fd.placement()

    _testing.set_shm_placement_delays(b, 0.0, DELAY_US)
    # 17 calls decide each class; 5 more give the drift watch its reference.
    p = rounds(60, lambda k: k["schedule"] == "near" and k["settled"])
    assert sorted(k["min_bytes"] for k in p["classes"]) == [4 * n for n in CLASS_SIZES], p
    assert [k["one_shot"] for k in sorted(p["classes"], key=lambda k: k["min_bytes"])] == [True, True] + [False] * 4, p
    for k in p["classes"]:
        assert k["schedule"] == "near" and k["settled"] and k["pairs"] >= 8, p
        assert k["far_us"] > k["near_us"] + 0.8 * DELAY_US, p
    _same_everywhere(p)
    before = p["decisions"]

    _testing.set_shm_placement_delays(b, DELAY_US, 0.0)
    p = rounds(80, lambda k: k["schedule"] == "far" and k["settled"])
    for k in p["classes"]:
        assert k["schedule"] == "far" and k["settled"], p
        assert k["near_us"] > k["far_us"] + 0.8 * DELAY_US, p
    assert p["checks"] >= 1 and p["decisions"] >= before + len(ts), p
    _same_everywhere(p)
    _testing.set_shm_placement_delays(b, 0.0, 0.0)
    finish()


@pytest.mark.parametrize("device,layout,world", shapes(cpu_worlds=[2, 3], cuda_layouts=[]))
@batched(sc_placement_slower_form_loses)
def test_a_slower_form_loses_in_every_class(request, device, layout, world):
    assert_ok(scenario_result(request))


@scenario
def sc_placement_noise_is_revisited():
    """Trials whose pairs disagree (every other call delayed, on every rank)
    end unsettled at the most pairs; the class is measured again later and
    then settles on the form that is faster."""
    b, t = _measured_two_shot()

    # Measured again 8 calls after an unsettled decision (not 256), before a
    # drift check could measure it again for its own reason on a busy machine.
    _testing.set_shm_placement_delays(b, 0.0, 0.0, DELAY_US, revisit_calls=8)
    p = _calls(t, 200, lambda k: k["schedule"] != "measuring")
    k = p["classes"][0]
    assert k["schedule"] in ("near", "far") and not k["settled"] and k["pairs"] == 32, p
    assert p["decisions"] == 1 and p["revisits"] == 0, p
    _same_everywhere(p)
    # The noise is gone and the form not chosen is slower: the revisit (not
    # a drift: the chosen form's rate is unchanged) settles on the chosen one.
    noisy_choice = k["schedule"]
    _testing.set_shm_placement_delays(b, *((0.0, DELAY_US) if noisy_choice == "near" else (DELAY_US, 0.0)),
                                    revisit_calls=8)
    p = _calls(t, 100, lambda k: k["settled"])
    k = p["classes"][0]
    assert p["revisits"] == 1 and p["decisions"] >= 2, p
    assert (k["schedule"], k["settled"]) == (noisy_choice, True) and k["pairs"] >= 8, p
    _same_everywhere(p)
    _testing.set_shm_placement_delays(b, 0.0, 0.0)
    finish()


@pytest.mark.parametrize("device,layout,world", shapes(cpu_worlds=[2], cuda_layouts=[]))
@batched(sc_placement_noise_is_revisited)
def test_a_decision_under_noise_is_measured_again(request, device, layout, world):
    assert_ok(scenario_result(request))


@scenario
def sc_placement_settled_form_is_rechecked():
    """A class settled on far keeps far's rate when near becomes the faster
    form (no drift to see): the re-check of the settled decision finds it."""
    b, t = _measured_two_shot()
    _testing.set_shm_placement_delays(b, 2 * DELAY_US, DELAY_US, recheck_calls=8)
    p = _calls(t, 40, lambda k: k["schedule"] != "measuring")
    k = p["classes"][0]
    assert (k["schedule"], k["settled"]) == ("far", True) and p["rechecks"] == 0, p
    # Near loses its delay, far keeps its own: far's rate does not move.
    _testing.set_shm_placement_delays(b, 0.0, DELAY_US, recheck_calls=8)
    p = _calls(t, 80, lambda k: k["schedule"] == "near")
    k = p["classes"][0]
    assert (k["schedule"], k["settled"]) == ("near", True) and p["rechecks"] >= 1 and p["revisits"] == 0, p
    _same_everywhere(p)
    _testing.set_shm_placement_delays(b, 0.0, 0.0)
    finish()


@pytest.mark.parametrize("device,layout,world", shapes(cpu_worlds=[2], cuda_layouts=[]))
@batched(sc_placement_settled_form_is_rechecked)
def test_a_settled_form_is_measured_again(request, device, layout, world):
    assert_ok(scenario_result(request))


def test_placement_knob_is_checked_and_forces_the_schedule(monkeypatch):
    store = dist.HashStore()
    monkeypatch.setenv("FASTPAR_SHM_PLACEMENT", "spread")
    with pytest.raises(ValueError, match="FASTPAR_SHM_PLACEMENT is 'spread' but must be 'auto', 'near' or 'far'"):
        dist.init_process_group("fastpar", store=store, rank=0, world_size=1)
    if dist.is_initialized():
        dist.destroy_process_group()
    monkeypatch.setenv("FASTPAR_SHM_PLACEMENT", "far")
    dist.init_process_group("fastpar", store=dist.HashStore(), rank=0, world_size=1)
    try:
        p = fd.placement()
        assert (p["mode"], p["schedule"], p["classes"], p["decisions"]) == ("far", "far", [], 0), p
        with pytest.raises(ValueError, match="mode is 'sideways' but must be 'auto', 'near' or 'far'"):
            _testing.set_shm_placement(fd.get_fastpar_backend(), "sideways")
    finally:
        dist.destroy_process_group()
