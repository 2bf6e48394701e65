"""fastpar.cuda_ipc's Store rendezvous without a GPU: threads stand for the
ranks, a torch.distributed HashStore for the store, and a stand-in for
torch.classes.fastpar.CudaIpcComm records what connect() hands it.

Checked: connect and close can run again on the same store and prefix (the
same ranks reconnecting): each round has keys of its own (a generation from
store.add), so a second connect gets the second round's handles, never the
first one's, and a second close's barrier waits for every rank's second
close instead of passing on the first one's keys."""
import datetime
import threading
import time

import pytest
import torch

import fastpar.cuda_ipc as cuda_ipc

WORLD = 3


class FakeComm:
    """What connect() and close() use of CudaIpcComm; each instance a new arena."""

    made = 0
    lock = threading.Lock()

    def __init__(self, rank, world_size, device, slot_bytes):
        with FakeComm.lock:
            FakeComm.made += 1
            self.arena = FakeComm.made
        self.rank = rank
        self.connected_to = None
        self.closed = False

    def handle(self):
        # 64 bytes naming this rank and arena, as a cudaIpcMemHandle_t would.
        return torch.tensor([self.rank, self.arena % 256] + [7] * 62, dtype=torch.uint8)

    def connect(self, handles):
        assert handles.shape == (WORLD, 64) and handles.dtype == torch.uint8
        self.connected_to = [(int(h[0]), int(h[1])) for h in handles]

    def synchronize(self):
        pass

    def close(self):
        self.closed = True


@pytest.fixture
def fake_comm(monkeypatch):
    FakeComm.made = 0
    monkeypatch.setattr(torch.classes.fastpar, "CudaIpcComm", FakeComm)


def run_ranks(fn):
    errors, results = [], [None] * WORLD

    def body(r):
        try:
            results[r] = fn(r)
        except BaseException as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return results


def test_reconnect_gets_the_new_handles(fake_comm):
    store = torch.distributed.HashStore()

    def rank(r):
        rounds = []
        for _ in range(3):
            comm = cuda_ipc.connect(store, r, WORLD, "cuda:0", slot_bytes=4096)
            rounds.append(comm)
            cuda_ipc.close(comm, store, r, WORLD)
            assert comm.closed
        return rounds

    per_rank = run_ranks(rank)
    for g in range(3):
        arenas = [per_rank[q][g].arena % 256 for q in range(WORLD)]
        for r in range(WORLD):
            # Every rank's handle of this round, in rank order; with fixed keys
            # round 1 would have read round 0's (stale) handles.
            assert per_rank[r][g].connected_to == [(q, arenas[q]) for q in range(WORLD)], (r, g)


def test_second_close_waits_for_every_rank(fake_comm):
    store = torch.distributed.HashStore()
    store.set_timeout(datetime.timedelta(seconds=30))
    comms = run_ranks(lambda r: cuda_ipc.connect(store, r, WORLD, "cuda:0"))
    run_ranks(lambda r: cuda_ipc.close(comms[r], store, r, WORLD))
    comms = run_ranks(lambda r: cuda_ipc.connect(store, r, WORLD, "cuda:0"))
    # Ranks 0 and 1 close; rank 2 is still busy: their barrier must hold.
    done = []
    early = [threading.Thread(target=lambda r=r: (cuda_ipc.close(comms[r], store, r, WORLD), done.append(r)))
             for r in range(WORLD - 1)]
    for t in early:
        t.start()
    time.sleep(0.5)
    assert done == [] and not any(c.closed for c in comms), "close passed its barrier on the last round's keys"
    cuda_ipc.close(comms[WORLD - 1], store, WORLD - 1, WORLD)
    for t in early:
        t.join(30)
    assert sorted(done) == list(range(WORLD - 1)) and all(c.closed for c in comms)


def test_rounds_keep_their_own_keys():
    store = torch.distributed.HashStore()
    got = run_ranks(lambda r: [cuda_ipc._exchange(store, "p", "x", r, WORLD, f"{r}:{g}".encode()) for g in range(4)])
    for r in range(WORLD):
        for g in range(4):
            assert got[r][g] == [f"{q}:{g}".encode() for q in range(WORLD)]
    # Another prefix, or another round name, starts at generation 0.
    assert cuda_ipc._generation(store, "q", "x", WORLD) == 0
    assert cuda_ipc._generation(store, "p", "y", WORLD) == 0
