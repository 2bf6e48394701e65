"""fastpar across hosts made of namespaces (netns_hosts.py: a network namespace
per host behind one switch, its own /dev/shm, pid, IPC and UTS namespaces),
needs root; skipped, naming what is missing, elsewhere.

- every collective, point to point within and across hosts, a subgroup across
  hosts, stock DDP and fastpar DDP, on 2 hosts x 2 ranks and 3 hosts of 2, 1
  and 1 ranks, launched by torchrun on each host, each layout with distinct
  hostnames and with one hostname for every host;
- faults: a rank of the other host SIGKILLed, a link taken down in the middle
  of a collective, the store's host gone. Every survivor raises
  DistBackendError no later than the group's timeout + 2 s after the fault,
  and no host's /dev/shm keeps anything. A leader that fails between hosts
  aborts its host's shared memory first: its host's other rank raises with
  it, naming it and its error, not when it exits.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import netns_hosts  # noqa: E402
from netns_hosts import Hosts  # noqa: E402

WORKER = os.path.join(HERE, "mh_worker.py")
MISSING = netns_hosts.missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"several hosts: {MISSING}")

TIMEOUT_S = 10  # the fault tests' group timeout


def worker_env(hs: Hosts, h: int, extra: dict | None = None) -> dict:
    env = hs.env({"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "FPMH_HOST": str(h)})
    env.update(extra or {})
    return env


def torchrun_all(hs: Hosts, nprocs: list[int], args: list[str], timeout: float = 150,
                 extra: dict | None = None) -> list[str]:
    """torchrun in every host (`extra`: more environment); returns each host's output (stdout + stderr)."""
    port = 29400
    procs = [hs.popen(h, hs.torchrun_argv(h, n, [WORKER, *args], port=port, run_id=f"fpmh{os.getpid()}"),
                      env=worker_env(hs, h, extra), stderr=subprocess.STDOUT)
             for h, n in enumerate(nprocs)]
    deadline = time.monotonic() + timeout
    outs = []
    for h, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            hs.close()  # kills every host's processes
            out, _ = p.communicate()
            out += f"\n[test] host {h}'s torchrun still ran after {timeout} s"
        outs.append(f"--- host {h} (exit {p.returncode}) ---\n{out}")
        assert p.returncode == 0, "\n".join(outs)
    return outs


LAYOUTS = {"2x2": [2, 2], "3x211": [2, 1, 1]}


@pytest.mark.parametrize("layout,names,schedule",
                         [(layout, names, "leaders") for layout in LAYOUTS for names in ("distinct", "one name")] +
                         [("2x2", "distinct", "sharded")])
def test_collectives_and_training_across_hosts(layout, names, schedule):
    """Every collective, point to point and subgroups across hosts, stock and
    fastpar DDP; all_reduce under both of its schedules between hosts
    (FASTPAR_HOSTS_ALLREDUCE: the sharded one on hosts of 2 ranks each)."""
    nprocs = LAYOUTS[layout]
    H, world = len(nprocs), sum(nprocs)
    hostnames = [f"node{h}" for h in range(H)] if names == "distinct" else ["trainer"] * H
    with Hosts(H, rate="10gbit", hostnames=hostnames) as hs:
        outs = torchrun_all(hs, nprocs, ["collectives", str(H)], extra={"FASTPAR_HOSTS_ALLREDUCE": schedule})
        text = "\n".join(outs)
        for what in ["hosts ", "all_reduce", "broadcast, reduce, gather, scatter",
                     "all_gather, all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single, barrier",
                     "point to point: ring", "stock DDP: 4 steps", "fastpar.DistributedDataParallel: 4 steps",
                     "done"]:
            n = len(re.findall(rf"rank \d+ ok: {re.escape(what)}", text))
            assert n == world, f"{n} ranks of {world} passed {what!r}\n{text}"
        even = len(set(nprocs)) == 1 and nprocs[0] >= 2
        ran = re.findall(r"ok: hosts \[[\d, ]+\], all_reduce (leaders|sharded)", text)  # ranks' lines may interleave
        assert ran == [schedule if even else "leaders"] * world, f"all_reduce schedules {ran}\n{text}"
        assert "within a host" in text or max(nprocs) == 1, text
        assert "across hosts" in text, text
        assert re.search(r"ok: subgroup \[[\d, ]+\] across hosts", text), text
        for h in range(H):
            assert hs.shm_entries(h) == [], f"host {h}'s /dev/shm keeps {hs.shm_entries(h)}"


def launch_direct(hs: Hosts, nprocs: list[int], args: list[str], port: int = 29500,
                  extra: dict | None = None) -> dict[int, subprocess.Popen]:
    """One process per rank (no torchrun: its agent would kill a dead rank's
    siblings before they can show how they fail); rank 0 serves the store
    (env://) on host 0. `extra`: more environment."""
    procs, rank = {}, 0
    world = sum(nprocs)
    for h, n in enumerate(nprocs):
        for _ in range(n):
            env = worker_env(hs, h, {"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": hs.hosts[0].ip,
                                     "MASTER_PORT": str(port), "FPMH_TIMEOUT": str(TIMEOUT_S), **(extra or {})})
            procs[rank] = hs.popen(h, [sys.executable, WORKER, *args], env=env, stderr=subprocess.STDOUT)
            rank += 1
    return procs


def wait_for(procs, pattern: str, ranks, within: float) -> None:
    """Reads the ranks' output lines until each of `ranks` printed `pattern`
    (the lines read are kept in p.lines)."""
    deadline = time.monotonic() + within
    for r in ranks:
        p = procs[r]
        p.lines = getattr(p, "lines", [])
        while not any(pattern in line for line in p.lines):
            if time.monotonic() > deadline:
                raise AssertionError(f"rank {r} did not print {pattern!r} within {within} s: {p.lines}")
            line = p.stdout.readline()
            if not line:
                raise AssertionError(f"rank {r} exited (code {p.wait()}) before {pattern!r}: {p.lines}")
            p.lines.append(line)


def finish(procs, ranks, within: float) -> dict[int, str]:
    outs = {}
    deadline = time.monotonic() + within
    for r in ranks:
        p = procs[r]
        try:
            rest, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            rest, _ = p.communicate()
            rest += f"\n[test] rank {r} still ran {within} s after the fault"
        outs[r] = "".join(getattr(p, "lines", [])) + rest
    return outs


def assert_survivors_raised(outs: dict[int, str], fault_time: float) -> None:
    every = "\n".join(f"--- rank {r} ---\n{o}" for r, o in outs.items())
    for r, out in outs.items():
        m = re.search(r"rank \d+ raised (\S+) at ([\d.]+)", out)
        assert m, f"rank {r} did not raise\n{every}"
        assert m.group(1) == "DistBackendError", f"rank {r} raised {m.group(1)}, not DistBackendError\n{every}"
        late = float(m.group(2)) - fault_time
        assert late <= TIMEOUT_S + 2, f"rank {r} raised {late:.1f} s after the fault (timeout {TIMEOUT_S} s)\n{every}"
        assert re.search(r"rank \d+ exiting", out), f"rank {r} did not get to its exit\n{every}"
        assert "[test] rank" not in out, f"rank {r} hung after raising\n{every}"
    print(f"fault at {fault_time:.3f}\n{every}")  # shown by pytest -rP


LINGER_S = 3  # how long the survivors of a kill stay after raising


def raised(out: str, again: bool = False) -> tuple[float, str]:
    """When a rank raised, and the first line of the message (from mh_worker.describe)."""
    m = re.search(rf"rank \d+ {'again ' if again else ''}raised \S+ at ([\d.]+): (.*)", out)
    assert m, out
    return float(m.group(1)), m.group(2)


def kill_one_of_2x2(hs: Hosts, victim: int, extra: dict | None = None) -> tuple[dict[int, str], str]:
    """2 hosts x 2 ranks in an all_reduce loop; `victim` SIGKILLs itself. Every
    survivor must raise DistBackendError within the timeout (+2 s), then again
    on its next call (a failed group stays failed), and no host's /dev/shm may
    keep anything. Returns the survivors' outputs and all of them as one text."""
    procs = launch_direct(hs, [2, 2], ["fault", "kill", str(victim), str(LINGER_S)], extra=extra)
    wait_for(procs, "killed at", [victim], within=60)
    fault_time = float(re.search(r"killed at ([\d.]+)", "".join(procs[victim].lines)).group(1))
    survivors = [r for r in range(4) if r != victim]
    outs = finish(procs, survivors, within=TIMEOUT_S + LINGER_S + 30)
    assert_survivors_raised(outs, fault_time)
    every = "\n".join(f"--- rank {r} ---\n{o}" for r, o in outs.items())
    for r in survivors:
        assert f"rank {r} again raised DistBackendError" in outs[r], every
    for h in range(2):
        assert hs.shm_entries(h) == [], f"host {h}'s /dev/shm keeps {hs.shm_entries(h)}"
    return outs, every


def test_rank_on_other_host_killed():
    """Host 1's leader (rank 2) SIGKILLed: rank 3 learns it from /proc, host 0's
    leader (rank 0) from gloo; rank 0 aborts host 0's shared memory before it
    raises, so rank 1, waiting for it there, raises within moments of it (not
    when rank 0 exits: every survivor stays LINGER_S s after raising), naming
    it and its error. A failed group stays failed: the next all_reduce raises."""
    with Hosts(2, rate="1gbit") as hs:
        outs, every = kill_one_of_2x2(hs, 2)  # rank 2 leads host 1
        t0, m0 = raised(outs[0])
        t1, m1 = raised(outs[1])
        assert "all_reduce on rank 0 failed between hosts (gloo): " in m0, every
        assert t1 - t0 < 1.5, f"rank 1 raised {t1 - t0:.3f} s after its leader, rank 0\n{every}"
        assert re.search(r"rank 0 \(pid \d+\) aborted the communicator: this host's leader failed between hosts: "
                         r"all_reduce on rank 0 failed between hosts \(gloo\): ", m1), every
        # Rank 0 hears of the death from gloo, or first from rank 3 through the failure notice.
        assert re.search(r"the communicator is unusable after an earlier error: (all_reduce on rank 0 failed between "
                         r"hosts \(gloo\)|the group failed on another rank): ", raised(outs[0], again=True)[1]), every
        print(f"rank 1 raised {t1 - t0:.3f} s after rank 0")


def test_rank_on_other_host_killed_under_the_sharded_all_reduce():
    """FASTPAR_HOSTS_ALLREDUCE=sharded: rank 3 (host 1's second rank, not its
    leader) SIGKILLed. Its column peer, rank 1 on host 0, learns it from gloo
    at once and aborts host 0's shared memory naming its column; rank 2 learns
    it from /proc. Rank 0 learns it from rank 1's abort where it waits in
    shared memory; where it waits in its own column's gloo for rank 2 (which
    has raised and stays on: gloo says nothing), from the failure notice, so
    within a second of rank 2 and not when rank 2 exits (LINGER_S later).
    Every survivor raises DistBackendError within the timeout (+2 s), and a
    failed group stays failed."""
    with Hosts(2, rate="1gbit") as hs:
        outs, every = kill_one_of_2x2(hs, 3, extra={"FASTPAR_HOSTS_ALLREDUCE": "sharded"})
        assert "all_reduce on rank 1 failed between hosts (gloo): " in raised(outs[1])[1], every
        late = raised(outs[0])[0] - raised(outs[2])[0]
        assert late < 1, f"rank 0 raised {late:.3f} s after rank 2\n{every}"
        print(f"rank 0 raised {late:.3f} s after rank 2")


def test_link_down_in_a_collective():
    with Hosts(2, rate="1gbit") as hs:
        procs = launch_direct(hs, [2, 2], ["fault", "loop"])
        wait_for(procs, "looping", range(4), within=60)
        time.sleep(0.3)  # inside a call: each 4 MiB all_reduce takes tens of ms on these links
        fault_time = time.time()
        hs.link(1, up=False)
        outs = finish(procs, range(4), within=TIMEOUT_S + 30)
        assert_survivors_raised(outs, fault_time)
        for h in range(2):
            assert hs.shm_entries(h) == [], f"host {h}'s /dev/shm keeps {hs.shm_entries(h)}"


def test_store_host_gone():
    with Hosts(3, rate="1gbit") as hs:
        procs = launch_direct(hs, [1, 2, 1], ["fault", "loop"])  # rank 0 (host 0) serves the store
        wait_for(procs, "looping", range(4), within=60)
        time.sleep(0.3)
        fault_time = time.time()
        hs.link(0, up=False)  # the host vanishes: its link first, so that nothing is reset
        hs.kill_host(0)
        outs = finish(procs, [1, 2, 3], within=TIMEOUT_S + 30)
        assert_survivors_raised(outs, fault_time)
        for h in (1, 2):
            assert hs.shm_entries(h) == [], f"host {h}'s /dev/shm keeps {hs.shm_entries(h)}"


def test_harness_leaves_nothing():
    """After a Hosts is closed (here with a process still running in a host)
    no namespace, link, mount or process of it is left."""
    hs = Hosts(2, rate="1gbit").open()
    tag = hs._tag
    p = hs.popen(1, ["sleep", "1000"])
    hs.close()
    assert p.wait(timeout=10) is not None
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert tag not in names, names
    with open("/proc/mounts") as f:
        assert "fpmh-shm" not in f.read()
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"fpmh-shm" not in ps and tag not in ps, ps


def test_stale_namespaces_of_a_dead_process_are_removed():
    """A harness SIGKILLed mid-test leaves its network namespaces (nothing of
    it runs); the next Hosts deletes them, processes inside included."""
    code = (f"import sys, os, time; sys.path.insert(0, {HERE!r}); from netns_hosts import Hosts; "
            "hs = Hosts(2).open(); hs.popen(0, ['sleep', '1000']); print(hs._tag, flush=True); time.sleep(1000)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    tag = child.stdout.readline().strip()
    assert tag.startswith(netns_hosts.PREFIX), tag
    child.kill()
    child.wait()
    child.stdout.close()
    time.sleep(0.5)  # the pdeath signals of its children
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert tag in names, f"expected the killed harness's namespaces in: {names}"
    gone = netns_hosts.sweep_stale()
    assert {f"{tag}b", f"{tag}h0", f"{tag}h1"} <= set(gone), gone
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert tag not in names, names
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "fpmh-shm" not in ps, ps
