"""Installing fastpar never breaks `import torch`.

torch (2.5+) loads every `torch.backends` entry point inside `import torch` and
turns any exception, a missing module included, into a RuntimeError of the
import itself. An environment can see fastpar's metadata without its module:
an editable install whose checkout moved or was deleted, or a layered
environment (PYTHONPATH, `python -S`) that reads the site-packages but not the
`.pth` import hook of the editable install. These tests build such
environments and run `import torch` in them."""
from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap

import pytest

from ci_policy import under_ci
from entry_point_metadata import TORCH_LOADS_BACKENDS_ON_DEMAND, declared_entry_points, write_dist_info

pytest.importorskip("tomllib")  # Python 3.11+, for pyproject.toml

MISSING = "fastpar_autoload_not_here"  # a module no environment has

# The child: import torch, then the groups torch loads on demand still work for
# other backends, and asking for "fastpar" fails naming it (not some other error).
CHILD = textwrap.dedent("""
    import importlib.metadata, sys
    import torch
    import torch.distributed as dist
    eps = [ep for ep in importlib.metadata.entry_points(group="torch.distributed.backends") if ep.name == "fastpar"]
    assert eps, "the child does not see fastpar's metadata: the environment is not the one meant"
    assert dist.is_backend_available("gloo")
    try:
        print("fastpar available:", dist.is_backend_available("fastpar"))
    except RuntimeError as e:
        print("fastpar refused:", e)
    print("import torch ok", torch.__version__)
""")

def missing_module(entry_points: dict) -> dict:
    """The same groups and names, every target in a module that does not exist."""
    return {g: {k: MISSING + ":" + v.split(":", 1)[1] for k, v in eps.items()} for g, eps in entry_points.items()}


def torch_site() -> str:
    import torch
    return os.path.dirname(os.path.dirname(torch.__file__))


def torch_site_without_fastpar(tmp_path) -> str:
    """torch's site-packages less any installed fastpar (its metadata and
    import hook), as links: the temporary metadata is then the only fastpar."""
    site = tmp_path / "torch-site"
    site.mkdir()
    src = torch_site()
    for name in os.listdir(src):
        if not name.lower().startswith(("fastpar", "__editable__")):
            os.symlink(os.path.join(src, name), site / name)
    return str(site)


def run_child(pythonpath: list, cwd, no_site: bool = False):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TORCH_DEVICE_BACKEND_AUTOLOAD")}
    env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    # -S: no site module, so no .pth file runs (the editable install's hook);
    # torch and the metadata come from PYTHONPATH only. -I is not used: it
    # would drop PYTHONPATH too.
    cmd = [sys.executable] + (["-S"] if no_site else []) + ["-c", CHILD]
    return subprocess.run(cmd, env=env, cwd=str(cwd), capture_output=True, text=True, timeout=120)


def test_declared_entry_points_with_their_module_gone(tmp_path):
    """pyproject.toml's entry points, each naming a module that is not there."""
    site = tmp_path / "site"
    write_dist_info(site, missing_module(declared_entry_points()))
    r = run_child([str(site), torch_site_without_fastpar(tmp_path)], tmp_path, no_site=True)
    assert r.returncode == 0, f"import torch failed:\n{r.stderr[-3000:]}"
    assert "import torch ok" in r.stdout
    if TORCH_LOADS_BACKENDS_ON_DEMAND:
        # the one place the missing module shows: a process that asks for "fastpar"
        assert "fastpar refused:" in r.stdout and "fastpar" in r.stdout.split("fastpar refused:")[1], r.stdout
    else:  # the entry point is never loaded: the backend is simply not there
        assert "fastpar available: False" in r.stdout, r.stdout


def test_a_torch_backends_entry_point_would_break_import_torch(tmp_path):
    """The failure the tests above guard against, so they can fail: the same
    environment with a `torch.backends` entry point makes `import torch` raise."""
    site = tmp_path / "site"
    eps = missing_module(declared_entry_points())
    eps["torch.backends"] = {"fastpar": MISSING + ":at_import"}
    write_dist_info(site, eps)
    r = run_child([str(site), torch_site_without_fastpar(tmp_path)], tmp_path, no_site=True)
    assert r.returncode != 0, r.stdout
    assert "Failed to load the backend extension: fastpar" in r.stderr, r.stderr[-3000:]


def test_installed_fastpar_seen_without_its_import_hook(tmp_path):
    """This environment's installed fastpar, read the way a layered
    environment reads it: its site-packages on PYTHONPATH, no .pth processed,
    the checkout not on the path."""
    try:
        dist = importlib.metadata.distribution("fastpar")
    except importlib.metadata.PackageNotFoundError:
        if under_ci():
            pytest.fail("fastpar is not installed (bash scripts/setup.sh installs it)")
        pytest.skip("fastpar is not installed")
    site = str(dist.locate_file(""))
    if os.path.exists(os.path.join(site, "fastpar_autoload.py")):
        pytest.skip("fastpar is installed as files in site-packages, not editable: its module cannot go missing")
    r = run_child([site], tmp_path, no_site=True)
    assert r.returncode == 0, f"import torch failed:\n{r.stderr[-3000:]}"
    assert "import torch ok" in r.stdout
