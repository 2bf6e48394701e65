"""Which ranks fastpar takes for one host (fastpar.distributed.backend._host_id):
ranks that share /dev/shm (and the pid and IPC namespaces of one kernel) are
one host whatever their hostnames; the same hostname over another /dev/shm is
another host; FASTPAR_HOST_ID overrides both; without /proc the hostname is
the id."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import pytest

from fastpar.distributed import backend

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

PRINT_ID = "from fastpar.distributed.backend import _host_id; import socket; print(_host_id(), socket.gethostname())"


def can_unshare() -> str | None:
    if os.geteuid() != 0:
        return f"namespaces need root (euid is {os.geteuid()})"
    if shutil.which("unshare") is None:
        return "needs unshare (util-linux), not found on PATH"
    p = subprocess.run(["unshare", "--uts", "--ipc", "--mount", "true"], capture_output=True, text=True)
    if p.returncode != 0:
        return f"unshare --uts --ipc --mount fails here: {p.stderr.strip()}"
    return None


def id_in(unshare_args: list[str], setup: str) -> tuple[str, str]:
    """(host id, hostname) of a process in new namespaces after `setup` (shell)."""
    env = dict(os.environ)
    env.pop("FASTPAR_HOST_ID", None)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    cmd = f"{setup} exec {sys.executable} -c '{PRINT_ID}'"
    p = subprocess.run(["unshare", *unshare_args, "sh", "-c", cmd], capture_output=True, text=True, env=env,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    host_id, hostname = p.stdout.split()
    return host_id, hostname


@pytest.fixture
def no_override(monkeypatch):
    monkeypatch.delenv("FASTPAR_HOST_ID", raising=False)


def test_override(monkeypatch):
    monkeypatch.setenv("FASTPAR_HOST_ID", "nodeA")
    assert backend._host_id() == "nodeA"


def test_id_names_the_shared_memory_not_the_hostname(no_override):
    shm = os.stat("/dev/shm")
    host_id = backend._host_id()
    assert f"shm:{shm.st_dev}:{shm.st_ino}" in host_id, host_id
    assert socket.gethostname() not in host_id.split("/"), host_id


def test_without_proc_the_hostname_is_the_id(no_override, monkeypatch):
    real_stat = os.stat

    def stat(path, *a, **kw):
        if str(path).startswith("/proc/self/ns/"):
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_stat(path, *a, **kw)

    monkeypatch.setattr(backend.os, "stat", stat)
    assert backend._host_id() == socket.gethostname()


@pytest.mark.skipif(can_unshare() is not None, reason=f"host identity in namespaces: {can_unshare()}")
def test_two_hostnames_sharing_dev_shm_are_one_host(no_override):
    """Like two containers of one pod: own hostnames, one /dev/shm and IPC namespace."""
    here, name = backend._host_id(), socket.gethostname()
    there, other = id_in(["--uts"], "hostname fp-other-name &&")
    assert other == "fp-other-name" and other != name
    assert there == here


@pytest.mark.skipif(can_unshare() is not None, reason=f"host identity in namespaces: {can_unshare()}")
def test_one_hostname_over_another_dev_shm_is_another_host(no_override):
    """Like two containers with one hostname and their own /dev/shm (docker's
    default): fastpar once took them for one host and failed at init."""
    here, name = backend._host_id(), socket.gethostname()
    setup = "mount -t tmpfs -o size=1m fp-identity-test /dev/shm &&"
    there, same_name = id_in(["--uts", "--ipc", "--mount", "--propagation", "private"], setup)
    assert same_name == name
    assert there != here
    # Only /dev/shm differs (same IPC namespace): still another host, for the segments live there.
    only_shm, _ = id_in(["--mount", "--propagation", "private"], setup)
    assert only_shm != here
    # Only the IPC namespace differs, /dev/shm shared: another host too (CUDA IPC is scoped by it).
    only_ipc, _ = id_in(["--ipc"], "")
    assert only_ipc != here
