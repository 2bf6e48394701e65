"""A group survives a forked child of a rank (a DataLoader worker, a
subprocess started by fork) that destroys its inherited copy and exits, with or
without os._exit, or that tries a collective on it: the parents' next
collectives give the right results, and nothing is left in /dev/shm."""
import os
import subprocess
import sys

import pytest

from dist_harness import child_env, shm_entries

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "init_crash_worker.py")


@pytest.mark.parametrize("forker", ["rank0", "both"])
@pytest.mark.parametrize("mode", ["exit", "_exit", "collective"])
def test_child_destroys_inherited_group(mode, forker):
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    procs = []
    for r in (0, 1):
        extra = ["--fork", mode] if (r == 0 or forker == "both") else []
        procs.append(subprocess.Popen([sys.executable, WORKER, str(r), "2", str(store.port), "60", *extra],
                                      env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    pids = [p.pid for p in procs]
    out = []
    for p in procs:
        try:
            out.append(p.communicate(timeout=120))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    q.kill()
            out.append(p.communicate())
    for r, (p, (o, e)) in enumerate(zip(procs, out)):
        assert p.returncode == 0 and "OK" in o, f"rank {r} rc={p.returncode}\n{o}\n{e}"
    assert {f for f in shm_entries() if any(f"_p{pid}_" in f for pid in pids)} == set()
