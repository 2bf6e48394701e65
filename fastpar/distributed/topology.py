"""The machine's CPU topology, read from sysfs, and where each local rank runs.

A cache line that moves between two cores of one L3 domain (a die, a CCX)
stays in that cache; between two L3 domains or two packages it crosses the
interconnect, several times slower. fastpar's shared-memory collectives move lines
between the ranks' cores in every step, so a host's ranks run fastest inside
one L3 domain. read_topology() tells which CPUs share an L3 cache, a package
and a NUMA node; place() gives each local rank its CPUs (FASTPAR_BIND_CORES,
used by backend.py's _bind_cores).

Everything is read under a root directory ("/" by default; tests pass a fake
tree). A file that is missing or unreadable (containers often hide sysfs)
makes that part of the topology unknown, never an error:

- online CPUs: sys/devices/system/cpu/online (else the cpuN folders);
- L3 domains: sys/devices/system/cpu/cpuN/cache/indexK/shared_cpu_list where
  that index's `level` is 3; where some online CPU shows no L3, the packages
  stand in for the domains;
- packages: sys/devices/system/cpu/cpuN/topology/physical_package_id;
- NUMA nodes: sys/devices/system/node/nodeM/cpulist.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from fractions import Fraction

MODES = ("auto", "compact", "spread", "0")


def parse_cpulist(text: str) -> list[int]:
    """The CPUs of a kernel cpulist ("0-3,8,10-11" -> [0, 1, 2, 3, 8, 10, 11]),
    sorted, without repeats; "" is no CPU. ValueError on anything else."""
    out: set[int] = set()
    text = text.strip()
    if not text:
        return []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if m is None:
            raise ValueError(f"not a cpulist: {text!r}")
        lo, hi = int(m.group(1)), int(m.group(2) if m.group(2) is not None else m.group(1))
        if hi < lo:
            raise ValueError(f"not a cpulist: {text!r} (range {lo}-{hi})")
        out.update(range(lo, hi + 1))
    return sorted(out)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _read_cpulist(path: str) -> list[int] | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return parse_cpulist(text)
    except ValueError:
        return None


def _numbered(folder: str, prefix: str) -> list[int]:
    """The N of the folders PREFIXN in `folder`, sorted ([] if it cannot be read)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return sorted(int(n[len(prefix):]) for n in names if re.fullmatch(prefix + r"\d+", n))


def _partition(sets: dict[int, frozenset[int]], cpus: frozenset[int]) -> tuple[frozenset[int], ...] | None:
    """The distinct sets of `sets` (one per CPU of `cpus`, restricted to `cpus`),
    ordered by lowest CPU, if they partition `cpus`; else None."""
    parts = {s & cpus for s in sets.values()}
    parts.discard(frozenset())
    if set(sets) != set(cpus) or sum(len(p) for p in parts) != len(cpus) or any(c not in sets[c] for c in cpus):
        return None
    return tuple(sorted(parts, key=min))


@dataclass(frozen=True)
class Topology:
    """What sysfs shows of the CPUs. Empty means unknown.

    cpus: the online CPUs. domains: the L3 domains (the CPUs that share one
    L3 cache), ordered by lowest CPU; the packages where no L3 is shown
    (domain_source says which: "l3", "package", or None when unknown).
    packages: package id -> its CPUs. nodes: NUMA node id -> its CPUs (nodes
    without CPUs left out)."""
    cpus: frozenset[int] = frozenset()
    domains: tuple[frozenset[int], ...] = ()
    domain_source: str | None = None
    packages: dict[int, frozenset[int]] = field(default_factory=dict)
    nodes: dict[int, frozenset[int]] = field(default_factory=dict)

    def domain_index(self, cpu: int) -> int | None:
        """The index in `domains` of the domain holding `cpu`, or None."""
        return next((i for i, d in enumerate(self.domains) if cpu in d), None)

    def package_of(self, cpu: int) -> int | None:
        return next((p for p, s in self.packages.items() if cpu in s), None)

    def describe(self, cpus) -> dict:
        """Which L3 domains (indices into `domains`), packages and NUMA nodes
        (ids) the CPU set `cpus` touches, sorted; None for what is unknown.
        {"l3_domains": [...], "packages": [...], "numa_nodes": [...]}"""
        cpus = set(cpus)

        def touched(named):
            return sorted(k for k, s in named if cpus & s)
        return {
            "l3_domains": touched(enumerate(self.domains)) if self.domains else None,
            "packages": touched(self.packages.items()) if self.packages else None,
            "numa_nodes": touched(self.nodes.items()) if self.nodes else None,
        }


def read_topology(root: str = "/") -> Topology:
    """The topology sysfs under `root` shows (see the module docstring)."""
    cpu_dir = os.path.join(root, "sys", "devices", "system", "cpu")
    online = _read_cpulist(os.path.join(cpu_dir, "online"))
    if online is None:
        online = [n for n in _numbered(cpu_dir, "cpu")
                  if _read(os.path.join(cpu_dir, f"cpu{n}", "online")) != "0"]
    cpus = frozenset(online)
    if not cpus:
        return Topology()

    l3: dict[int, frozenset[int]] = {}
    pkg_of: dict[int, int] = {}
    for c in sorted(cpus):
        here = os.path.join(cpu_dir, f"cpu{c}")
        for k in _numbered(os.path.join(here, "cache"), "index"):
            index = os.path.join(here, "cache", f"index{k}")
            if _read(os.path.join(index, "level")) == "3":
                shared = _read_cpulist(os.path.join(index, "shared_cpu_list"))
                if shared:
                    l3[c] = frozenset(shared)
                    break
        pid = _read(os.path.join(here, "topology", "physical_package_id"))
        try:
            if pid is not None:
                pkg_of[c] = int(pid)
        except ValueError:
            pass

    packages: dict[int, frozenset[int]] = {}
    if set(pkg_of) == cpus:
        for p in sorted(set(pkg_of.values())):
            packages[p] = frozenset(c for c in cpus if pkg_of[c] == p)

    domains, source = _partition(l3, cpus), "l3"
    if domains is None and packages:
        domains, source = tuple(sorted(packages.values(), key=min)), "package"
    if domains is None:
        domains, source = (), None

    nodes: dict[int, frozenset[int]] = {}
    node_dir = os.path.join(root, "sys", "devices", "system", "node")
    for n in _numbered(node_dir, "node"):
        listed = _read_cpulist(os.path.join(node_dir, f"node{n}", "cpulist"))
        if listed and frozenset(listed) & cpus:
            nodes[n] = frozenset(listed) & cpus
    return Topology(cpus=cpus, domains=domains, domain_source=source, packages=packages, nodes=nodes)


def parse_mode(value: str | None) -> str:
    """FASTPAR_BIND_CORES's value as one of MODES ("1" is "compact"; unset or
    empty is "auto"). ValueError naming the variable, the value and the
    allowed values otherwise."""
    mode = (value or "").strip().lower() or "auto"
    mode = {"1": "compact"}.get(mode, mode)
    if mode not in MODES:
        raise ValueError(f"FASTPAR_BIND_CORES is {value!r} but must be 'auto', 'compact' (or '1'), 'spread' or '0'")
    return mode


def _slices(cpus: list[int], n: int) -> list[list[int]]:
    """`cpus` cut into n contiguous slices as equal as can be (the i-th is
    cpus[i*len/n : (i+1)*len/n])."""
    return [cpus[i * len(cpus) // n:(i + 1) * len(cpus) // n] for i in range(n)]


def _groups(allowed: list[int], topology: Topology | None) -> list[tuple[int, list[int]]]:
    """The allowed CPUs of each domain that has some, as (package order, CPUs),
    domains ordered by lowest CPU; one group of every allowed CPU when the
    topology is unknown or some allowed CPU lies in no known domain."""
    if topology is None or not topology.domains:
        return [(0, allowed)]
    mine = set(allowed)
    groups = [sorted(d & mine) for d in topology.domains if d & mine]
    if sum(len(g) for g in groups) != len(allowed):
        return [(0, allowed)]
    pkgs: list[int | None] = []
    out = []
    for g in sorted(groups, key=min):
        p = topology.package_of(g[0])
        if p not in pkgs:
            pkgs.append(p)
        out.append((pkgs.index(p), g))
    return out


def place(allowed, local_size: int, mode: str, topology: Topology | None = None,
          online=None) -> list[list[int]] | None:
    """Each local rank's CPUs (sorted lists, index = local rank), or None for
    no binding. A pure function of its arguments.

    allowed: the CPUs the process may use; topology: read_topology()'s (None
    or empty: unknown); mode: one of MODES or "1" (parse_mode); online: the
    online CPUs, which "auto" compares `allowed` with.

    No binding for mode "0", fewer than 2 ranks or fewer CPUs than ranks, nor
    for "auto" when `allowed` is not every online CPU (someone - taskset,
    numactl, a launcher - chose already). Otherwise every rank gets its own
    CPUs, all inside one L3 domain (as domains the topology knows; all of
    `allowed` is one domain when it does not):

    compact ("auto", "compact", "1"): the ranks sit in as few L3 domains as
    possible while each rank gets at least one CPU: the fewest domains whose
    allowed CPUs number at least local_size (the largest such domains, the
    earlier on ties, in the order of their package, then of their lowest CPU).
    The ranks are spread over these domains so that the smallest share is as
    large as it can be (ties: the earlier domain takes the extra rank), and
    each domain's CPUs are cut into contiguous, as-equal-as-can-be slices for
    its ranks, lower ranks first. So two ranks on two domains of 4 CPUs both
    sit in domain 0 with 2 CPUs each, and the other domain is left to other
    work. With one domain (or an unknown topology) the ranks get the
    local_size contiguous slices of `allowed`, as fastpar always did.

    spread: the ranks go round-robin over the domains, taken one per package
    in turn (the first domain of each package, then the second of each, ...),
    skipping a domain that has as many ranks as allowed CPUs; each domain's
    CPUs are cut among its ranks as above. Two ranks on two packages then get
    one package each (all of one L3 domain each), for memory bandwidth."""
    mode = parse_mode(mode)
    allowed = sorted(set(allowed))
    if mode == "0" or local_size < 2 or len(allowed) < local_size:
        return None
    if mode == "auto" and online is not None and set(allowed) != set(online):
        return None
    groups = _groups(allowed, topology)
    counts = [len(g) for _, g in groups]
    ranks: list[list[int]] = [[] for _ in groups]  # the local ranks of each group
    if mode == "spread":
        order = sorted(range(len(groups)), key=lambda j: (
            sum(1 for i in range(j) if groups[i][0] == groups[j][0]), groups[j][0]))
        step = 0
        for r in range(local_size):
            while len(ranks[order[step % len(order)]]) >= counts[order[step % len(order)]]:
                step += 1
            ranks[order[step % len(order)]].append(r)
            step += 1
    else:
        by_package = sorted(range(len(groups)), key=lambda j: (groups[j][0], groups[j][1][0]))
        by_size = sorted(by_package, key=lambda j: -counts[j])  # stable: package order on ties
        m = next(m for m in range(1, len(groups) + 1) if sum(counts[j] for j in by_size[:m]) >= local_size)
        chosen = [j for j in by_package if j in by_size[:m]]
        number = {j: 1 for j in chosen}
        for _ in range(local_size - m):
            j = max(chosen, key=lambda j: (Fraction(counts[j], number[j] + 1), -chosen.index(j)))
            number[j] += 1
        r = 0
        for j in chosen:
            ranks[j] = list(range(r, r + number[j]))
            r += number[j]
    out: list[list[int]] = [[] for _ in range(local_size)]
    for (_, cpus), rs in zip(groups, ranks):
        for r, share in zip(rs, _slices(cpus, len(rs)) if rs else []):
            out[r] = share
    return out
