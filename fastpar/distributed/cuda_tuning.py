"""Schedule choices measured per GPU model (docs/knobs.md, "Per-GPU tuning").

`benchmarks/bench_cuda.py` times each CUDA IPC schedule beside the one it
replaces, in the same run, and its summary writes the winners for the GPU it
ran on as `tuning.json` in its results. `python -m fastpar.distributed.cuda_tuning
--adopt FILE` merges such a file into the table fastpar ships,
`cuda_tuning.json` next to this module. Every CUDA engine is given the table
when its group is created; its IPC setup applies the entry of the group's GPU
model (when every rank runs on that model) to each choice no
`FASTPAR_CUDA_IPC_*` knob or setter made. `CudaEngine.ipc_tuning` says which
entry is in force.

FASTPAR_CUDA_TUNING: the path of a table to use instead, or "off" for none.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

TABLE = Path(__file__).with_name("cuda_tuning.json")


def read(path) -> dict:
    """The entries of a table file, GPU model -> entry. The values are
    checked by the engine that takes them (CudaEngine._set_tuning_table)."""
    with open(path) as f:
        doc = json.load(f)
    models = doc.get("models") if isinstance(doc, dict) else None
    if not isinstance(models, dict) or not all(isinstance(e, dict) for e in models.values()):
        raise ValueError(f"{path} is not a CUDA tuning table: it must be an object whose 'models' maps each GPU "
                         f"model to an object of choices")
    return models


def fields(entry: dict) -> dict:
    """One entry as the engine takes it: strings, with the one-shot limits
    per rank count as "one_shot_max_bytes/<ranks>"."""
    out = {}
    for key, value in entry.items():
        if key == "one_shot_max_bytes" and isinstance(value, dict):
            out.update({f"{key}/{ranks}": str(limit) for ranks, limit in value.items()})
        else:
            out[key] = str(value)
    return out


def table() -> dict:
    """What CudaEngine._set_tuning_table takes: the shipped table, the one
    FASTPAR_CUDA_TUNING names, or none ("off")."""
    knob = os.environ.get("FASTPAR_CUDA_TUNING", "")
    if knob == "off":
        return {}
    path = knob or TABLE
    try:
        models = read(path)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"FASTPAR_CUDA_TUNING is '{knob}' but that table cannot be read: {e}"
                         if knob else f"fastpar's CUDA tuning table {path} cannot be read: {e}") from None
    return {model: fields(entry) for model, entry in models.items()}


def adopt(entries_path, table_path=TABLE) -> list:
    """Merges the entries of `entries_path` (a summary's tuning.json) into the
    table at `table_path`, replacing those of the same models; returns the
    models merged."""
    new = read(entries_path)
    doc = {"models": {}}
    if Path(table_path).exists():
        doc = {"models": read(table_path)}
    doc["models"].update(new)
    doc["models"] = dict(sorted(doc["models"].items()))
    with open(f"{table_path}.tmp", "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(f"{table_path}.tmp", table_path)
    return sorted(new)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--adopt", metavar="FILE", required=True, help="a tuning.json written by bench_cuda.py's summary")
    p.add_argument("--table", default=str(TABLE), help="the table to merge into (default: fastpar's own)")
    args = p.parse_args(argv)
    models = adopt(args.adopt, args.table)
    print(f"{args.table}: entries for {', '.join(models) or 'no model'} from {args.adopt}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
