"""Several test scenarios in one launch of N rank processes (a process start,
a CUDA context, an MPS client each cost seconds): the worker side runs a
list of scenarios in turn, each between report lines on stdout

    [scenario ID] begin
    ... its output, and the traceback when it failed ...
    [scenario ID] ok in 1.2 s        or        [scenario ID] FAILED in 3.4 s

and the test side cuts each rank's output into the scenarios' reports, so
every test still fails by its scenario's name (dist_worker.py "batch",
batched_scenarios.py; tooling/test_scenario_batch.py checks both sides with
gloo probes of its own)."""
from __future__ import annotations

import datetime
import json
import os
import re
import time
import traceback
from typing import Callable

from dist_harness import RankResult


def run_batch(specs_json: str, rank: int, world: int, store, run_one: Callable[[dict, str], None],
              on_failure: Callable[[], None] = lambda: None) -> None:
    """Worker side. specs_json: a list of {"id", "ref", "args", "env"};
    run_one(spec, prefix) runs one scenario, its process group on the keys
    under `prefix` of `store`. Each scenario's env is set around it; every
    rank waits for every other at each scenario's start (also after one that
    failed early on some ranks); a failure is reported, on_failure() called
    (abort the group, so peers fail it at once rather than at their
    timeout), and the batch goes on."""
    for i, spec in enumerate(json.loads(specs_json)):
        sid, prefix = spec["id"], f"scenario{i}/"
        env = spec.get("env", {})
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        print(f"[scenario {sid}] begin", flush=True)
        t0 = time.monotonic()
        try:
            store.set(f"{prefix}ready{rank}", "1")
            store.wait([f"{prefix}ready{q}" for q in range(world)], datetime.timedelta(seconds=120))
            run_one(spec, prefix)
            print(f"[scenario {sid}] ok in {time.monotonic() - t0:.1f} s", flush=True)
        except BaseException:  # noqa: B902 (an AssertionError or a DistBackendError alike: report, go on)
            print(traceback.format_exc(), flush=True)
            print(f"[scenario {sid}] FAILED in {time.monotonic() - t0:.1f} s", flush=True)
            try:
                on_failure()
            except BaseException:  # noqa: B902
                pass
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def section(r: RankResult, sid: str) -> RankResult:
    """Test side: rank r's report of scenario `sid`: rc 0 when it printed ok,
    1 when FAILED (the section's output holds the traceback), 2 when it never
    reported (the launch died or was killed first: the tail of its output and
    stderr say why)."""
    begin = re.search(rf"^\[scenario {re.escape(sid)}\] begin$", r.out, re.M)
    end = re.search(rf"^\[scenario {re.escape(sid)}\] (ok|FAILED)\b.*$", r.out, re.M)
    if begin is None or end is None:
        why = "never started" if begin is None else "started but never finished"
        return RankResult(r.rank, 2, f"scenario {sid} {why} (launch rc={r.rc})\n" + r.out[-3000:], r.err[-3000:])
    body = r.out[begin.end():end.start()]
    return RankResult(r.rank, 0 if end.group(1) == "ok" else 1, body + end.group(0), r.err[-3000:])
