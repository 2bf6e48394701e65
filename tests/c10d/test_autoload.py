"""The backend "fastpar" in processes that never import fastpar: torch finds it
through the entry points pyproject.toml declares (fastpar_autoload.py).

Entry points exist once a package is installed; so that these tests run the
checkout as it is, each subprocess gets a throwaway `fastpar-*.dist-info` on
its PYTHONPATH whose entry_points.txt is written from pyproject.toml's
tables. importlib.metadata (what torch calls) reads it exactly as it reads an
installed package's."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from dist_harness import ROOT
from entry_point_metadata import TORCH_LOADS_BACKENDS_ON_DEMAND, declared_entry_points, write_dist_info

pytest.importorskip("tomllib")  # Python 3.11+, for pyproject.toml

GROUPS = ("torch.distributed.backends",)

# Runs first in every child: import torch and prove no fastpar module came with it.
PRELUDE = textwrap.dedent("""
    import os, sys
    import torch
    import torch.distributed as dist
    def no_fastpar(where):
        loaded = sorted(m for m in sys.modules if m == "fastpar" or m.startswith("fastpar."))
        assert not loaded, f"{where}: {loaded} imported"
    no_fastpar("import torch")
    assert "fastpar_autoload" not in sys.modules, "import torch loaded fastpar_autoload"
""")

needs_on_demand = pytest.mark.skipif(not TORCH_LOADS_BACKENDS_ON_DEMAND,
                                     reason="this torch has no torch.distributed.backends entry-point group")


@pytest.fixture
def site(tmp_path):
    """A directory holding fastpar's metadata as an install would write it."""
    eps = declared_entry_points()
    write_dist_info(tmp_path / "site", {g: eps[g] for g in GROUPS})
    return str(tmp_path / "site")


def run_child(site: str | None, body, tmp_path, env: dict | None = None, timeout: float = 120):
    """Runs PRELUDE + body (a string, or a tuple of strings each indented its own way)."""
    script = tmp_path / "child.py"
    parts = body if isinstance(body, tuple) else (body,)
    script.write_text(PRELUDE + "".join(textwrap.dedent(p) for p in parts))
    e = {k: v for k, v in os.environ.items()
         if k not in ("FASTPAR_AUTOLOAD", "TORCH_DEVICE_BACKEND_AUTOLOAD", "PYTHONPATH")}
    e["PYTHONPATH"] = os.pathsep.join(([site] if site else []) + [ROOT])
    e["STORE"] = str(tmp_path / "store")
    e.update(env or {})
    return subprocess.run([sys.executable, str(script)], env=e, cwd=str(tmp_path), capture_output=True,
                          text=True, timeout=timeout)


def ok(r):
    assert r.returncode == 0, f"rc={r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r.stdout


ONE_RANK = """
    dist.init_process_group("fastpar", init_method="file://" + os.environ["STORE"], rank=0, world_size=1)
    t = torch.arange(4.0)
    dist.all_reduce(t)
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0], t
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    assert type(backend).__name__ == "Backend", type(backend)
    dist.destroy_process_group()
    print("created", "fastpar._C" in sys.modules)
"""


def test_declared_entry_points_name_functions_of_fastpar_autoload():
    import fastpar_autoload

    eps = declared_entry_points()
    assert eps["torch.distributed.backends"] == {"fastpar": "fastpar_autoload:on_demand"}
    # torch.backends runs inside every `import torch`: a missing fastpar module
    # would break torch itself (tests/tooling/test_import_torch.py)
    assert "torch.backends" not in eps
    assert callable(fastpar_autoload.on_demand)


@needs_on_demand
def test_one_rank_without_importing_fastpar(site, tmp_path):
    out = ok(run_child(site, ONE_RANK, tmp_path))
    assert "created True" in out


@needs_on_demand
@pytest.mark.usefixtures("no_leftover_segments")
def test_two_spawned_ranks_without_importing_fastpar(site, tmp_path):
    # The children start fresh interpreters (spawn) and run only this file's
    # top level and worker(): nothing in them imports fastpar.
    out = ok(run_child(site, """
        import torch.multiprocessing as mp

        def worker(rank, world):
            no_fastpar(f"rank {rank} before init")
            dist.init_process_group("fastpar", init_method="file://" + os.environ["STORE"], rank=rank,
                                    world_size=world)
            t = torch.full((5,), float(rank + 1))
            dist.all_reduce(t)
            assert t.tolist() == [3.0] * 5, t
            g = [torch.empty(2, dtype=torch.int64) for _ in range(world)]
            dist.all_gather(g, torch.full((2,), rank))
            assert [x.tolist() for x in g] == [[0, 0], [1, 1]], g
            assert type(dist.group.WORLD._get_backend(torch.device("cpu"))).__name__ == "Backend"
            dist.destroy_process_group()

        if __name__ == "__main__":
            mp.spawn(worker, args=(2,), nprocs=2)
            no_fastpar("the parent")
            print("spawned ok")
    """, tmp_path, timeout=240))
    assert "spawned ok" in out


@needs_on_demand
@pytest.mark.parametrize("var", ["FASTPAR_AUTOLOAD", "TORCH_DEVICE_BACKEND_AUTOLOAD"])
def test_opt_out_leaves_the_backend_unknown_until_import_fastpar(site, tmp_path, var):
    out = ok(run_child(site, ("""
        try:
            dist.init_process_group("fastpar", init_method="file://" + os.environ["STORE"], rank=0, world_size=1)
        except Exception as e:
            print("refused:", type(e).__name__, e)
        else:
            raise AssertionError("init_process_group('fastpar') worked with autoload off")
        no_fastpar("the refused init")
        import fastpar  # registers it, as without any entry point
        os.remove(os.environ["STORE"]) if os.path.exists(os.environ["STORE"]) else None
    """, ONE_RANK), tmp_path, env={var: "0"}))
    assert "Unknown backend" in out and "fastpar" in out, out
    assert "created True" in out


def _installed_entry_point() -> bool:
    """Whether this environment's installed fastpar declares its entry points
    (pip install -e . does): then no child can run without them."""
    import importlib.metadata as md
    eps = md.entry_points()
    group = eps.select(group="torch.distributed.backends") if hasattr(eps, "select") else eps.get(
        "torch.distributed.backends", [])
    return any(ep.name == "fastpar" for ep in group)


@pytest.mark.skipif(_installed_entry_point(), reason="the installed fastpar declares its entry points")
def test_without_the_entry_points_the_backend_is_unknown(tmp_path):
    """What users of a fastpar without entry points saw (in spawned
    children): torch's own error."""
    out = ok(run_child(None, """
        try:
            dist.init_process_group("fastpar", init_method="file://" + os.environ["STORE"], rank=0, world_size=1)
        except (AssertionError, ValueError, RuntimeError) as e:
            print("refused:", e)
    """, tmp_path))
    assert "Unknown backend" in out, out


@needs_on_demand
def test_import_fastpar_after_autoload_keeps_the_one_registration(site, tmp_path):
    ok(run_child(site, ("""
        import fastpar_autoload
        assert dist.is_backend_available("fastpar")  # asks by name: the on-demand entry point registers
        no_fastpar("is_backend_available")
        plugin = dist.Backend._plugins["FASTPAR"]
        assert plugin.creator_fn is fastpar_autoload._create, plugin
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            import fastpar
        assert dist.Backend._plugins["FASTPAR"] is plugin
        assert dist.Backend.backend_list.count("fastpar") == 1
    """, ONE_RANK), tmp_path))

