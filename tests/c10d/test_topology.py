"""CPU topology from sysfs and the placement of local ranks
(fastpar/distributed/topology.py, FASTPAR_BIND_CORES).

Fake sysfs trees are written under tmp_path: one L3 domain of 2 CPUs (this
machine's), 2 packages x 2 L3 domains x 4 CPUs, a machine whose caches are not
shown (the packages stand in), and no sysfs at all."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dist_harness import ROOT
from fastpar.distributed import topology
from fastpar.distributed.topology import Topology, parse_cpulist, parse_mode, place, read_topology


def write(root, rel: str, text: str) -> None:
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text + "\n")


def fake_sysfs(root, online: str | None, cpus: dict, nodes: dict | None = None) -> str:
    """cpus: cpu -> (L3 shared_cpu_list or None, package id or None);
    nodes: node id -> cpulist. Each CPU also gets an L1 and an L2 index (level
    1 and 2, its own), which must not count as its L3 domain."""
    root = str(root)
    cpu = "sys/devices/system/cpu"
    if online is not None:
        write(root, f"{cpu}/online", online)
    for c, (l3, pkg) in cpus.items():
        os.makedirs(os.path.join(root, cpu, f"cpu{c}"), exist_ok=True)
        if l3 is not None:
            for k, (level, shared) in enumerate([(1, str(c)), (2, str(c)), (3, l3)]):
                write(root, f"{cpu}/cpu{c}/cache/index{k}/level", str(level))
                write(root, f"{cpu}/cpu{c}/cache/index{k}/shared_cpu_list", shared)
        if pkg is not None:
            write(root, f"{cpu}/cpu{c}/topology/physical_package_id", str(pkg))
    for n, listed in (nodes or {}).items():
        write(root, f"sys/devices/system/node/node{n}/cpulist", listed)
    return root


@pytest.fixture
def one_domain(tmp_path):
    """2 CPUs sharing one L3, one package, one node (this machine)."""
    return read_topology(fake_sysfs(tmp_path, "0-1", {0: ("0-1", 0), 1: ("0-1", 0)}, {0: "0-1"}))


@pytest.fixture
def two_sockets(tmp_path):
    """2 packages x 2 L3 domains x 4 CPUs: domains 0-3, 4-7 (package 0, node
    0), 8-11, 12-15 (package 1, node 1)."""
    l3 = ["0-3", "4-7", "8-11", "12-15"]
    cpus = {c: (l3[c // 4], c // 8) for c in range(16)}
    return read_topology(fake_sysfs(tmp_path, "0-15", cpus, {0: "0-7", 1: "8-15"}))


@pytest.fixture
def no_caches(tmp_path):
    """8 CPUs, no cache folders, packages numbered alternately (even CPUs on
    package 0, odd ones on package 1, as many 2-socket servers number them)."""
    return read_topology(fake_sysfs(tmp_path, "0-7", {c: (None, c % 2) for c in range(8)},
                                    {0: "0,2,4,6", 1: "1,3,5,7"}))


def test_parse_cpulist():
    assert parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("5") == [5]
    assert parse_cpulist(" 0-1\n") == [0, 1]
    assert parse_cpulist("") == []
    assert parse_cpulist("4,0-2,1") == [0, 1, 2, 4]
    for bad in ("a", "3-1", "1,,2", "1-", "-1", "0-3;5"):
        with pytest.raises(ValueError, match="cpulist"):
            parse_cpulist(bad)


def test_read_one_domain(one_domain):
    assert one_domain == Topology(cpus=frozenset({0, 1}), domains=(frozenset({0, 1}),), domain_source="l3",
                                  packages={0: frozenset({0, 1})}, nodes={0: frozenset({0, 1})})
    assert one_domain.describe([1]) == {"l3_domains": [0], "packages": [0], "numa_nodes": [0]}


def test_read_two_sockets(two_sockets):
    t = two_sockets
    assert t.domain_source == "l3"
    assert [sorted(d) for d in t.domains] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert {p: sorted(s) for p, s in t.packages.items()} == {0: list(range(8)), 1: list(range(8, 16))}
    assert {n: sorted(s) for n, s in t.nodes.items()} == {0: list(range(8)), 1: list(range(8, 16))}
    assert t.describe([0, 1]) == {"l3_domains": [0], "packages": [0], "numa_nodes": [0]}
    assert t.describe([3, 4]) == {"l3_domains": [0, 1], "packages": [0], "numa_nodes": [0]}
    assert t.describe([7, 8, 15]) == {"l3_domains": [1, 2, 3], "packages": [0, 1], "numa_nodes": [0, 1]}
    assert t.describe([]) == {"l3_domains": [], "packages": [], "numa_nodes": []}


def test_read_no_caches_falls_back_to_packages(no_caches):
    t = no_caches
    assert t.domain_source == "package"
    assert [sorted(d) for d in t.domains] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert t.describe([2, 3]) == {"l3_domains": [0, 1], "packages": [0, 1], "numa_nodes": [0, 1]}


def test_read_no_sysfs(tmp_path):
    t = read_topology(str(tmp_path))
    assert t == Topology()
    assert t.describe([0, 1]) == {"l3_domains": None, "packages": None, "numa_nodes": None}


def test_read_partial_and_broken_files(tmp_path):
    """No `online` file: the cpuN folders count (less those whose online is 0).
    One CPU without an L3: the packages stand in. A garbled package id: packages
    unknown, so the domains are too. An unreadable node list: that node is left out."""
    root = fake_sysfs(tmp_path / "a", None, {0: ("0-1", 0), 1: ("0-1", 0), 2: (None, 0), 3: ("3", 0)},
                      {0: "0-3", 1: "garbage"})
    write(root, "sys/devices/system/cpu/cpu3/online", "0")
    t = read_topology(root)
    assert sorted(t.cpus) == [0, 1, 2]
    assert t.domain_source == "package" and [sorted(d) for d in t.domains] == [[0, 1, 2]]
    assert {n: sorted(s) for n, s in t.nodes.items()} == {0: [0, 1, 2]}

    root = fake_sysfs(tmp_path / "b", "0-1", {0: (None, 0), 1: (None, None)})
    write(root, "sys/devices/system/cpu/cpu1/topology/physical_package_id", "x")
    t = read_topology(root)
    assert t.cpus == frozenset({0, 1}) and t.domains == () and t.domain_source is None and t.packages == {}
    assert place([0, 1, 2, 3], 2, "compact", t) == [[0, 1], [2, 3]]

    # L3 lists that do not partition the CPUs (0 says 0-1, 1 says 1-2): packages stand in.
    root = fake_sysfs(tmp_path / "c", "0-2", {0: ("0-1", 0), 1: ("1-2", 0), 2: ("1-2", 0)})
    assert read_topology(root).domain_source == "package"


def test_place_one_domain_is_contiguous_slices(one_domain):
    for mode in ("auto", "1", "compact", "spread"):
        assert place([0, 1], 2, mode, one_domain, online=[0, 1]) == [[0], [1]]


def test_place_unknown_topology_is_contiguous_slices():
    cpus = list(range(8))
    for topo in (None, Topology()):
        for mode in ("compact", "spread"):
            assert place(cpus, 2, mode, topo) == [[0, 1, 2, 3], [4, 5, 6, 7]]
            assert place(cpus, 3, mode, topo) == [[0, 1], [2, 3, 4], [5, 6, 7]]
            assert place(cpus, 8, mode, topo) == [[c] for c in cpus]


@pytest.mark.parametrize("n, expected", [
    (2, [[0, 1], [2, 3]]),
    (3, [[0], [1], [2, 3]]),
    (4, [[0], [1], [2], [3]]),
    (5, [[0], [1], [2, 3], [4, 5], [6, 7]]),
    (8, [[0], [1], [2], [3], [4], [5], [6], [7]]),
    (16, [[c] for c in range(16)]),
])
def test_place_compact_two_sockets(two_sockets, n, expected):
    allowed = sorted(two_sockets.cpus)
    assert place(allowed, n, "compact", two_sockets) == expected
    assert place(allowed, n, "auto", two_sockets, online=allowed) == expected


@pytest.mark.parametrize("n, expected", [
    (2, [[0, 1, 2, 3], [8, 9, 10, 11]]),
    (3, [[0, 1, 2, 3], [8, 9, 10, 11], [4, 5, 6, 7]]),
    (4, [[0, 1, 2, 3], [8, 9, 10, 11], [4, 5, 6, 7], [12, 13, 14, 15]]),
    (8, [[0, 1], [8, 9], [4, 5], [12, 13], [2, 3], [10, 11], [6, 7], [14, 15]]),
])
def test_place_spread_two_sockets(two_sockets, n, expected):
    assert place(sorted(two_sockets.cpus), n, "spread", two_sockets) == expected


@pytest.mark.parametrize("n, compact, spread", [
    (2, [[0, 2], [4, 6]], [[0, 2, 4, 6], [1, 3, 5, 7]]),
    (3, [[0], [2], [4, 6]], [[0, 2], [1, 3, 5, 7], [4, 6]]),  # spread: domain 0 holds ranks 0 and 2
    (4, [[0], [2], [4], [6]], [[0, 2], [1, 3], [4, 6], [5, 7]]),
    (8, [[0], [2], [4], [6], [1], [3], [5], [7]], [[0], [1], [2], [3], [4], [5], [6], [7]]),
])
def test_place_no_caches(no_caches, n, compact, spread):
    assert place(list(range(8)), n, "compact", no_caches) == compact
    assert place(list(range(8)), n, "spread", no_caches) == spread


def test_place_restricted_cpus(two_sockets):
    t = two_sockets
    # "auto" leaves a process alone that someone bound already.
    assert place(range(4, 10), 2, "auto", t, online=t.cpus) is None
    # compact: the fewest domains, the largest first: domain 1's 4 CPUs hold both ranks.
    assert place(range(4, 10), 2, "1", t) == [[4, 5], [6, 7]]
    assert place([0, 4, 5, 6, 7], 2, "compact", t) == [[4, 5], [6, 7]]
    assert place(range(4, 10), 3, "compact", t) == [[4], [5], [6, 7]]
    assert place(range(4, 10), 5, "compact", t) == [[4], [5], [6], [7], [8, 9]]
    # spread: one rank per package, then round-robin, a full domain skipped.
    assert place(range(4, 10), 2, "spread", t) == [[4, 5, 6, 7], [8, 9]]
    assert place([0, 1, 2, 3, 8], 4, "spread", t) == [[0], [8], [1], [2, 3]]
    # A CPU outside every known domain: the topology is not used.
    assert place([0, 1, 2, 99], 2, "compact", t) == [[0, 1], [2, 99]]


def test_place_no_binding(two_sockets):
    cpus = sorted(two_sockets.cpus)
    assert place(cpus, 4, "0", two_sockets) is None
    assert place(cpus, 1, "compact", two_sockets) is None
    assert place([0, 1, 2], 4, "compact", two_sockets) is None
    assert place([0, 1, 2], 4, "spread", two_sockets) is None


def test_parse_mode():
    assert [parse_mode(v) for v in (None, "", " auto ", "1", "compact", "SPREAD", "0")] == \
        ["auto", "auto", "auto", "compact", "compact", "spread", "0"]
    with pytest.raises(ValueError) as e:
        parse_mode("bogus")
    msg = str(e.value)
    for word in ("FASTPAR_BIND_CORES", "'bogus'", "'auto'", "'compact'", "'1'", "'spread'", "'0'"):
        assert word in msg, msg
    with pytest.raises(ValueError, match="FASTPAR_BIND_CORES is 'bogus'"):
        place([0, 1], 2, "bogus", None)


def test_bind_cores_and_report():
    """In a fresh process (binding changes the whole process's CPUs): with
    FASTPAR_BIND_CORES=1, local rank 1 of 2 gets place()'s second share of this
    machine, binding_report() says so, and the threads run there."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    code = (
        "import json, os\n"
        "import fastpar.distributed as fd\n"
        "from fastpar.distributed import backend, topology\n"
        "before = fd.binding_report()\n"
        "expected = topology.place(os.sched_getaffinity(0), 2, 'compact', topology.read_topology())[1]\n"
        "backend._bind_cores(1, 2)\n"
        "print(json.dumps({'before': before, 'expected': expected, 'after': fd.binding_report(),\n"
        "                  'core_binding': fd.core_binding(), 'affinity': sorted(os.sched_getaffinity(0))}))\n"
    )
    env = dict(os.environ, FASTPAR_BIND_CORES="1", PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["before"]["bound"] is False and got["before"]["mode"] == "compact"
    assert got["core_binding"] == got["affinity"] == got["expected"] == got["after"]["cpus"]
    topo = topology.read_topology()
    assert got["after"] == {"mode": "compact", "bound": True, "cpus": got["expected"],
                            **topo.describe(got["expected"]), "domain_source": topo.domain_source}

    env["FASTPAR_BIND_CORES"] = "sometimes"
    out = subprocess.run([sys.executable, "-c", "from fastpar.distributed import backend; backend._bind_cores(0, 2)"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "FASTPAR_BIND_CORES is 'sometimes'" in out.stderr, out.stderr
