"""Point-to-point over shared memory (send / recv / isend / irecv /
batch_isend_irecv / any source / tags / objects) and the direct calls
(fastpar.distributed.all_reduce, broadcast, all_gather_into_tensor), in real
processes. 1 KiB channel chunks make every size above 1 KiB cross several
chunks and wrap the 4-chunk ring. On CUDA tensors: send/recv over CUDA IPC
(batched with the other CUDA scenarios, batched_scenarios.py; skipped
without a GPU)."""
import re

import pytest

from batched_scenarios import CUDA_LAYOUTS, assert_scenario_ok, batched, cuda_only, scenario_result, shapes
from dist_harness import assert_ok, run

pytestmark = pytest.mark.usefixtures("no_leftover_segments")
SMALL_CHUNKS = {"FASTPAR_SHM_P2P_CHUNK_BYTES": "1024"}


@pytest.mark.parametrize("device,layout,world", shapes(cpu_worlds=[2, 3]))
@batched(lambda p: "p2p" if p["device"] == "cuda" else None)
def test_p2p_against_sent_values(request, device, layout, world):
    if device == "cuda":  # every ordered pair, every dtype, sizes past a ring's chunks, tags, any source refused
        assert_scenario_ok(scenario_result(request, device, layout, world, "p2p"), device, "p2p")
        return
    results = run("p2p_values", world, env=SMALL_CHUNKS, timeout=170)
    assert_ok(results)
    assert all("p2p_values: ok" in r.out for r in results), [r.out for r in results]


@pytest.mark.parametrize("layout,world", CUDA_LAYOUTS)
@cuda_only
@batched("p2p_first")
def test_send_recv_first_with_a_bound_device(request, layout, world):
    assert_scenario_ok(scenario_result(request, "cuda", layout, world, "p2p_first"), "cuda", "p2p_first")


def test_p2p_across_hosts_uses_gloo():
    results = run("p2p_hosts", 3, per_rank_env=lambda r: {"FASTPAR_HOST_ID": f"host{r % 2}"})
    assert_ok(results)
    assert all("p2p_hosts: ok" in r.out for r in results)


def test_p2p_bad_input_and_size_mismatch():
    results = run("p2p_bad_input", 2, env=SMALL_CHUNKS)
    assert_ok(results)
    assert "rank 0 sent 40 bytes (float32 x 10) with tag 0 but this receive expects 80 bytes" in results[1].out


def _elapsed(err: str) -> float:
    m = re.search(r"ERROR after ([0-9.]+)s", err)
    assert m, err
    return float(m.group(1))


@pytest.mark.parametrize("kind", ["kill_before_send", "kill_mid_transfer"])
def test_p2p_peer_dies(kind):
    # a 60 s timeout: the receiver must notice the death itself, within seconds
    results = run("p2p_fault", 2, env={"FASTPAR_SHM_P2P_CHUNK_BYTES": "1024"}, args=[kind, 60],
                  timeout=50)
    assert results[0].rc == -9, results[0].err
    r1 = results[1]
    assert r1.rc == 3, (r1.rc, r1.err)
    assert "fastpar.recv on rank 1: rank 0 (pid" in r1.err and "exited while this rank waited" in r1.err, r1.err
    assert "timeout 60000 ms" in r1.err
    if kind == "kill_mid_transfer":
        assert re.search(r"[1-9][0-9]* of 800000 bytes moved", r1.err), r1.err
    assert _elapsed(r1.err) < 30


def test_p2p_timeout():
    results = run("p2p_fault", 2, args=["never_sends", 2], timeout=60)
    r1 = results[1]
    assert r1.rc == 3, (r1.rc, r1.err)
    assert "fastpar.recv on rank 1 timed out after 2000 ms waiting for rank 0" in r1.err, r1.err
    assert "has not posted the matching send" in r1.err


@pytest.mark.parametrize("world", [2, 3])
def test_direct_calls(world):
    results = run("direct", world, timeout=170)
    assert_ok(results)
    assert "direct: ok" in results[0].out, results[0].out
