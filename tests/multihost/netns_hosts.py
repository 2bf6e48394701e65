"""Several "hosts" on one Linux machine, made of namespaces (needs root).

Each host is
  - a network namespace (`ip netns add`) with one veth, `fpveth`, whose other
    end is a port of a bridge in a namespace of its own (the "switch"); both
    ends shaped by `tc ... tbf` to the link rate, so each direction of each
    host's link carries at most that rate (netem does not run here; tbf does);
  - a pid, IPC, mount and UTS namespace (`unshare`), with its own tmpfs on
    /dev/shm and its own hostname (or one hostname for every host, the layout
    that once made fastpar take two hosts for one), whose first process (a
    `sleep`) holds it. Programs enter a host with `nsenter`.

The bridge has an address too (SWITCH_IP): a launcher started in the switch's
network namespace (popen_switch) reaches every host, like a login node, and
starts programs in them through rsh_agent(), a stand-in for ssh that enters
the named host's namespaces (mpirun's plm_rsh_agent).

Everything is removed however the test ends:
  - close() (the context manager's exit, atexit, SIGTERM/SIGINT/SIGHUP)
    SIGKILLs each host's `unshare`, and the kernel then kills every process
    of that host's pid namespace (unshare --kill-child makes its child, the
    namespace's init, die with it; the init's death kills the rest), which
    also frees its mounts and IPC objects; then it deletes the network
    namespaces, which deletes the veths and the bridge, and its tmpdir.
  - If this process is SIGKILLed, nothing of it runs: every process it starts
    has PR_SET_PDEATHSIG, so the processes die all the same, and the network
    namespaces, named `fpmh<pid>...` with this process's pid, and its tmpdir
    (/tmp/fpmh<pid>) are deleted by the next Hosts() (of any process) once
    that pid is gone.

Missing root, `ip`, `unshare`, `nsenter`, `tc` or kernel support is reported by
`missing()` as a sentence, for pytest.skip.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

PREFIX = "fpmh"  # network namespaces: fpmh<pid>b (the switch), fpmh<pid>h<i> (host i)
IFNAME = "fpveth"  # the host's end of its link, in every host
SUBNET = "10.77.0."
SWITCH_IP = SUBNET + "254"  # the bridge's own address: a launcher in the switch's namespace reaches every host
TOOLS = ("ip", "unshare", "nsenter", "tc")

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent():
    """preexec_fn: SIGKILL this child when the process that started it dies
    (it survives the exec into ip/unshare/nsenter: none is set-uid)."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _sh(*argv: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess:
    p = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed with exit code {p.returncode}: {p.stderr.strip()}")
    return p


def missing() -> str | None:
    """Why hosts cannot be made here (a sentence), or None."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux, not {sys.platform}"
    if os.geteuid() != 0:
        return f"making network namespaces needs root (euid is {os.geteuid()})"
    absent = [t for t in TOOLS if shutil.which(t) is None]
    if absent:
        return f"making hosts needs {', '.join(absent)} (iproute2 / util-linux), not found on PATH"
    name = f"{PREFIX}{os.getpid()}probe"
    try:
        _sh("ip", "netns", "add", name)
        try:
            _sh("ip", "-n", name, "link", "add", "br0", "type", "bridge")
            _sh("ip", "-n", name, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
            _sh("ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "v0", "root", "tbf", "rate", "1gbit",
                "burst", "256kb", "latency", "50ms")
            _sh("unshare", "--pid", "--fork", "--mount-proc", "--ipc", "--mount", "--uts", "true")
        finally:
            _sh("ip", "netns", "del", name, check=False)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        return f"this kernel or container cannot make the hosts' namespaces: {e}"
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Deletes the network namespaces and the tmpdir of Hosts whose process is
    gone (SIGKILLed before it could clean up), with any process still in the
    namespaces. Returns their names."""
    gone = []
    for line in _sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.fullmatch(rf"{PREFIX}(\d+)(b|h\d+|probe)", name)
        if not m or _alive(int(m.group(1))):
            continue
        for pid in _sh("ip", "netns", "pids", name, check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        _sh("ip", "netns", "del", name, check=False)
        gone.append(name)
    for name in os.listdir(tempfile.gettempdir()):
        m = re.fullmatch(rf"{PREFIX}(\d+)", name)
        if m and not _alive(int(m.group(1))):
            shutil.rmtree(os.path.join(tempfile.gettempdir(), name), ignore_errors=True)
            gone.append(name)
    return gone


class Host:
    def __init__(self, index: int, netns: str, hostname: str):
        self.index = index
        self.netns = netns
        self.hostname = hostname
        self.ip = f"{SUBNET}{index + 1}"
        self.unshare: subprocess.Popen | None = None  # holds the namespaces
        self.init_pid: int | None = None  # the pid namespace's first process, as this namespace sees it

    @property
    def shm_dir(self) -> str:
        """This host's /dev/shm, seen from outside through its init's root."""
        return f"/proc/{self.init_pid}/root/dev/shm"


class Hosts:
    """`n` hosts joined by one switch, each link shaped to `rate` (tc's
    syntax: "1gbit", "10gbit"; None: unshaped). `hostnames`: one per host
    (default host0, host1, ...); pass the same name for every host to have
    hosts that differ only in what they share."""

    _open: list["Hosts"] = []
    _handlers_installed = False
    ifname = IFNAME  # what programs in the hosts restrict their TCP to
    cidr = f"{SUBNET}0/24"  # every host's address and the switch's

    def __init__(self, n: int, rate: str | None = "1gbit", hostnames: list[str] | None = None,
                 shm_size: str = "512m"):
        if n < 1:
            raise ValueError(f"Hosts: n is {n} but must be at least 1")
        hostnames = list(hostnames) if hostnames is not None else [f"host{i}" for i in range(n)]
        if len(hostnames) != n:
            raise ValueError(f"Hosts: hostnames has {len(hostnames)} entries but n is {n}")
        self.rate = rate
        self.shm_size = shm_size
        tag = f"{PREFIX}{os.getpid()}"
        k = sum(1 for h in Hosts._open if h._tag.startswith(tag))  # several Hosts in one process
        self._tag = tag if k == 0 else f"{tag}x{k}"
        if not re.fullmatch(rf"{PREFIX}\d+", self._tag):
            raise RuntimeError(f"Hosts: one process holds one Hosts at a time (open: {len(Hosts._open)})")
        self.switch = f"{self._tag}b"
        # files of launchers that run in several hosts (Open MPI's session
        # directories): /tmp is this machine's in every host
        self.tmpdir = os.path.join(tempfile.gettempdir(), self._tag)
        self.hosts = [Host(i, f"{self._tag}h{i}", hostnames[i]) for i in range(n)]
        self._procs: list[subprocess.Popen] = []
        self._made: list[str] = []
        self._made_tmpdir = False
        self._closed = False

    # --- making and removing ---------------------------------------------------------------
    def __enter__(self) -> "Hosts":
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> "Hosts":
        why = missing()
        if why:
            raise RuntimeError(why)
        sweep_stale()
        Hosts._install_handlers()
        Hosts._open.append(self)
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def _netns(self, name: str) -> None:
        _sh("ip", "netns", "add", name)
        self._made.append(name)

    def _make(self) -> None:
        os.makedirs(self.tmpdir, exist_ok=True)  # an earlier Hosts of this process may not have emptied it
        self._made_tmpdir = True
        self._netns(self.switch)
        _sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        _sh("ip", "-n", self.switch, "addr", "add", f"{SWITCH_IP}/24", "dev", "br0")
        for h in self.hosts:
            self._netns(h.netns)
            port = f"p{h.index}"
            _sh("ip", "-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", IFNAME,
                "netns", h.netns)
            _sh("ip", "-n", self.switch, "link", "set", port, "master", "br0", "up")
            _sh("ip", "-n", h.netns, "addr", "add", f"{h.ip}/24", "dev", IFNAME)
            _sh("ip", "-n", h.netns, "link", "set", IFNAME, "up")
            _sh("ip", "-n", h.netns, "link", "set", "lo", "up")
            self._start_holder(h)
        if self.rate:
            self.set_rate(self.rate)

    def _start_holder(self, h: Host) -> None:
        # unshare's parent ignores SIGTERM; close() SIGKILLs it. The script
        # mounts this host's /dev/shm and names it, then stays as init.
        script = (f"mount -t tmpfs -o size={self.shm_size},mode=1777 fpmh-shm /dev/shm && "
                  f"hostname {h.hostname} && echo ready && exec sleep infinity")
        p = subprocess.Popen(
            ["ip", "netns", "exec", h.netns, "unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc",
             "--mount", "--uts", "--propagation", "private", "sh", "-c", script],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_die_with_parent)
        h.unshare = p
        line = p.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"host {h.index} ({h.netns}) did not start: {line!r} {p.stderr.read()}")
        with open(f"/proc/{p.pid}/task/{p.pid}/children") as f:
            h.init_pid = int(f.read().split()[0])

    def set_rate(self, rate: str | None) -> None:
        """Shapes both directions of every host's link to `rate` (None: unshaped)."""
        for h in self.hosts:
            for ns, dev in ((h.netns, IFNAME), (self.switch, f"p{h.index}")):
                _sh("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root", check=False)
                if rate:
                    _sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                        "burst", "256kb", "latency", "50ms")
        self.rate = rate

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for p in self._procs + [h.unshare for h in self.hosts if h.unshare]:
            if p.poll() is None:
                try:
                    p.kill()
                except ProcessLookupError:
                    pass
        for p in self._procs + [h.unshare for h in self.hosts if h.unshare]:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            for f in (p.stdout, p.stderr):
                if f:
                    f.close()
        for name in reversed(self._made):
            for pid in _sh("ip", "netns", "pids", name, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _sh("ip", "netns", "del", name, check=False)
        if self._made_tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
        if self in Hosts._open:
            Hosts._open.remove(self)

    @classmethod
    def _install_handlers(cls) -> None:
        if cls._handlers_installed:
            return
        cls._handlers_installed = True
        atexit.register(cls._close_all)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            previous = signal.getsignal(sig)

            def handler(signum, frame, previous=previous):
                cls._close_all()
                if callable(previous):
                    previous(signum, frame)
                else:
                    signal.signal(signum, signal.SIG_DFL)
                    os.kill(os.getpid(), signum)

            try:
                signal.signal(sig, handler)
            except ValueError:  # not the main thread: atexit and the stale sweep still hold
                pass

    @classmethod
    def _close_all(cls) -> None:
        for h in list(cls._open):
            h.close()

    # --- using ---------------------------------------------------------------------------
    def _enter(self, h: int) -> list[str]:
        return ["nsenter", "-t", str(self.hosts[h].init_pid), "--net", "--ipc", "--mount", "--uts", "--pid",
                f"--wd={os.getcwd()}", "--"]

    def popen(self, h: int, argv: list[str], env: dict | None = None, **kw) -> subprocess.Popen:
        """Starts `argv` in host `h` (cwd kept); it dies with its host."""
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("text", True)
        p = subprocess.Popen(self._enter(h) + list(argv), env=env, preexec_fn=_die_with_parent, **kw)
        self._procs.append(p)
        return p

    def popen_switch(self, argv: list[str], env: dict | None = None, **kw) -> subprocess.Popen:
        """Starts `argv` in the switch's network namespace (this machine's pid,
        IPC and mount namespaces), at SWITCH_IP: a launcher that reaches every
        host's address and starts programs in the hosts with rsh_agent(), as
        mpirun on a login node does with ssh. It dies with the Hosts."""
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("text", True)
        p = subprocess.Popen(["ip", "netns", "exec", self.switch, *argv], env=env, preexec_fn=_die_with_parent, **kw)
        self._procs.append(p)
        return p

    def rsh_agent(self) -> list[str]:
        """A command that stands for ssh to the hosts: `<it> <host's ip> <shell
        command line...>` runs the command line with sh inside that host's
        namespaces (Open MPI's plm_rsh_agent; run from popen_switch())."""
        where = ",".join(f"{h.ip}={h.init_pid}" for h in self.hosts)
        here = os.path.abspath(__file__)
        if any(c.isspace() for c in sys.executable + here):
            raise RuntimeError(f"rsh_agent: {sys.executable} or {here} has a space, which a launcher's agent "
                               "string cannot hold")
        return [sys.executable, here, "rsh", where]

    def run(self, h: int, argv: list[str], timeout: float = 20) -> subprocess.CompletedProcess:
        return subprocess.run(self._enter(h) + list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, timeout=timeout, preexec_fn=_die_with_parent)

    def shm_entries(self, h: int) -> list[str]:
        """What is in host `h`'s /dev/shm."""
        return sorted(os.listdir(self.hosts[h].shm_dir))

    def link(self, h: int, up: bool) -> None:
        """Takes host `h`'s link down (packets vanish, nothing is reset) or up."""
        _sh("ip", "-n", self.hosts[h].netns, "link", "set", IFNAME, "up" if up else "down")

    def kill_host(self, h: int) -> None:
        """Every process of host `h` dies at once (its pid namespace's init is
        SIGKILLed); its link and /dev/shm go with nothing else of it."""
        os.kill(self.hosts[h].init_pid, signal.SIGKILL)

    def torchrun_argv(self, h: int, nproc: int, script: list[str], port: int = 29400, run_id: str = "fpmh",
                      python: str = sys.executable, extra: list[str] = ()) -> list[str]:
        """torchrun for host `h`: c10d rendezvous at host 0, which serves the
        rendezvous store; --local-addr so that the workers' store address is an
        address the other hosts reach (the hosts' names resolve nowhere)."""
        return [python, "-m", "torch.distributed.run", "--nnodes", str(len(self.hosts)), "--nproc-per-node",
                str(nproc), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{self.hosts[0].ip}:{port}",
                "--rdzv-id", run_id, "--rdzv-conf", f"is_host={'true' if h == 0 else 'false'}",
                "--local-addr", self.hosts[h].ip, "--max-restarts", "0", *extra, *script]

    def env(self, extra: dict | None = None) -> dict:
        """The environment for programs in a host: gloo on the host's link."""
        e = dict(os.environ)
        e["GLOO_SOCKET_IFNAME"] = IFNAME
        e["OMP_NUM_THREADS"] = "1"
        e.update(extra or {})
        return e


def _rsh(where: str, argv: list[str]) -> None:
    """The body of rsh_agent(): argv is ssh's: options, the host, then the
    command line (words that a remote shell joins with spaces)."""
    pids = dict(kv.split("=") for kv in where.split(","))
    while argv and argv[0].startswith("-"):  # ssh options a launcher may add (-x: no X11)
        argv = argv[1:]
    if len(argv) < 2 or argv[0] not in pids:
        sys.exit(f"netns_hosts rsh: expected one of the hosts {', '.join(pids)} and a command, got {argv}")
    os.execvp("nsenter", ["nsenter", "-t", pids[argv[0]], "--net", "--ipc", "--mount", "--uts", "--pid",
                          f"--wd={os.getcwd()}", "--", "sh", "-c", " ".join(argv[1:])])


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "rsh":
        _rsh(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(f"usage: {sys.argv[0]} rsh <ip>=<pid>,... <host> <command...> (Hosts.rsh_agent() writes it)")
