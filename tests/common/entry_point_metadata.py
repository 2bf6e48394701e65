"""fastpar's entry points as pyproject.toml declares them, written into a
throwaway `fastpar-*.dist-info` the way pip writes an installed package's,
and whether this torch reads them on demand. Shared by the tests that run
torch in processes which see only that metadata (tests/c10d/test_autoload.py,
tests/tooling/test_import_torch.py)."""
from __future__ import annotations

import os
import pathlib

import torch.distributed

from dist_harness import ROOT

# torch 2.14+ loads the torch.distributed.backends group when a process asks
# for a backend by name; older torch never reads that group, and there a
# process registers the backend with `import fastpar` (fastpar_autoload.py).
TORCH_LOADS_BACKENDS_ON_DEMAND = hasattr(torch.distributed.Backend, "_ensure_backend_registered")


def declared_entry_points() -> dict:
    """pyproject.toml's [project.entry-points] tables: {group: {name: target}}."""
    import tomllib  # Python 3.11+; the tests that call this skip without it

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"].get("entry-points", {})


def write_dist_info(site: pathlib.Path, entry_points: dict) -> None:
    """fastpar's metadata in the directory `site`, with these entry points."""
    info = site / "fastpar-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fastpar\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(
        "".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
                for g, eps in entry_points.items()))
