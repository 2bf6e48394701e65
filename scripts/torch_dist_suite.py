#!/usr/bin/env python
"""PyTorch's own distributed test suite on gloo and on fastpar, side by side.

    python scripts/torch_dist_suite.py --world-size 2 --csv suite-ws2.csv
    python scripts/torch_dist_suite.py --world-size 3 -k all_gather   # a subset

Runs torch.testing._internal.distributed.distributed_test's
DistributedTest._DistTestBase (shipped in the torch wheel) the way PyTorch's
test/distributed/test_distributed_spawn.py does: a TestDistBackend subclass
whose every test starts WORLD_SIZE processes, each creating the default
group with init_process_group(BACKEND, file:// init method) and running the
test body. One child process per backend runs the whole suite.

Which tests run, and how: the suite decides by the name in BACKEND, both
when it is imported (skips such as "Only gloo backend supports timeouts",
sets like DistTestCases.backend_feature["ddp"]) and inside test bodies
(`if BACKEND == "gloo": <build the CPU model>`). fastpar is a CPU backend
meant to take gloo's place, so the suite runs exactly as for gloo, BACKEND
included, and every process group it creates with the name "gloo" is created
on fastpar instead (init_process_group, new_group, "cpu:gloo" specs).
dist.get_backend() then says "fastpar". Tests that gloo skips for gloo's own
limits are therefore skipped on fastpar too in that pass; a third pass runs
those of them whose feature fastpar has (CPU all_to_all, which the suite
tests on MPI only) on fastpar standing in for that backend's name
(OTHER_BACKEND_FEATURES).

Processes are forked (--start-method fork, the default; PyTorch's spawn with
--start-method spawn): on a small machine that is most of the run time.

Prints, per world size, "fastpar fails N tests that gloo passes (of M run)"
and those tests with fastpar's error; --csv writes every test's outcome on
both backends.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD_BACKEND = os.environ.get("FASTPAR_SUITE_BACKEND")  # set in the child that runs the suite

if CHILD_BACKEND:
    # Top level, so that spawned test processes (which re-import this file)
    # make the same switch as forked ones inherit. FASTPAR_SUITE_AS: the
    # backend name the suite sees (gloo, or another whose tests fastpar runs).
    STANDS_IN_FOR = os.environ.get("FASTPAR_SUITE_AS", "gloo")
    os.environ["BACKEND"] = STANDS_IN_FOR
    import functools
    import inspect

    import torch
    import torch.distributed.distributed_c10d as _c10d
    import torch.multiprocessing

    if CHILD_BACKEND == "fastpar":
        sys.path.insert(0, ROOT)
        import fastpar  # noqa: F401  registers the backend

        def _on_fastpar(backend):
            if backend is None:
                return None  # new_group: the default group's backend (fastpar already)
            return re.sub(rf"\b{STANDS_IN_FOR}\b", "fastpar", str(backend), flags=re.IGNORECASE)

        def _substituting(fn):
            sig = inspect.signature(fn)  # through torch's logging decorators (__wrapped__)

            @functools.wraps(fn)
            def wrapper(*args, **kwargs):
                bound = sig.bind_partial(*args, **kwargs)
                if "backend" in bound.arguments:
                    bound.arguments["backend"] = _on_fastpar(bound.arguments["backend"])
                return fn(*bound.args, **bound.kwargs)
            return wrapper

        for _fn in ("init_process_group", "new_group"):
            _wrapped = _substituting(getattr(_c10d, _fn))
            setattr(_c10d, _fn, _wrapped)  # new_subgroups and friends look it up here
            setattr(torch.distributed, _fn, _wrapped)

    from torch.testing._internal.distributed import distributed_test as _dt

    # The suite's decorators read BACKEND at import (the feature skips: those
    # of STANDS_IN_FOR); helpers such as skip_if_small_worldsize read it at run
    # time: they see gloo's name, whose place fastpar takes, so a test runs at
    # the world sizes it would run at on gloo.
    os.environ["BACKEND"] = "gloo"

    _START = os.environ.get("FASTPAR_SUITE_START", "fork")

    class TestDistBackendSuite(_dt.TestDistBackend, _dt.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._start_processes(torch.multiprocessing.get_context(_START).Process)


# Tests the suite runs on another backend only, for a CPU feature gloo lacks
# and fastpar has: gloo's skip reason -> the backend name fastpar runs them as.
OTHER_BACKEND_FEATURES = {
    re.compile(r"^Only MPI supports (CPU )?all_to_all"): "mpi",
}

# Tests that fail on fastpar only because of how it stands in for gloo here.
HARNESS_ARTIFACTS = {
    "test_get_backend": "asserts dist.get_backend() == BACKEND, and BACKEND stays 'gloo' (module docstring)",
}


def _reason(err_text: str) -> str:
    """The exception line a failed rank printed (the last 'XxxError: ...'), else the last line."""
    lines = [ln.strip() for ln in err_text.splitlines() if ln.strip()]
    found = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception|Exit|Failure)\b", ln)]
    return (found[-1] if found else (lines[-1] if lines else ""))[:400]


def run_child(out_json: str, pattern: str | None) -> int:
    import unittest

    loader = unittest.TestLoader()
    only = set(filter(None, os.environ.get("FASTPAR_SUITE_TESTS", "").split(",")))  # exact names, if given
    names = [n for n in loader.getTestCaseNames(TestDistBackendSuite)
             if (not pattern or pattern in n) and (not only or n in only)]
    suite = unittest.TestSuite(TestDistBackendSuite(n) for n in names)
    outcomes: dict[str, list] = {}

    class Record(unittest.TextTestResult):
        def _set(self, test, status, text=""):
            name = test.id().split(".")[-1]
            outcomes[name] = [status, text]
            with open(out_json, "w") as f:  # after every test: a killed run keeps what it has
                json.dump(outcomes, f)

        def addSuccess(self, test):
            super().addSuccess(test)
            self._set(test, "pass")

        def addFailure(self, test, err):
            super().addFailure(test, err)
            self._set(test, "fail", _reason(self._exc_info_to_string(err, test)))

        def addError(self, test, err):
            super().addError(test, err)
            self._set(test, "fail", _reason(self._exc_info_to_string(err, test)))

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            self._set(test, "skip", reason[:200])

        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            self._set(test, "xfail")

        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test)
            self._set(test, "xpass")

    unittest.TextTestRunner(resultclass=Record, verbosity=1, stream=sys.stderr).run(suite)
    return 0


def run_backend(backend: str, world: int, pattern: str | None, start: str, timeout: float, as_name: str = "gloo",
                tests: list[str] | None = None) -> dict:
    """The suite's outcomes on `backend`, the suite seeing the name `as_name`;
    only `tests` (exact names) where given."""
    with tempfile.TemporaryDirectory(prefix=f"torch-suite-{backend}-") as tmp:
        out_json = os.path.join(tmp, "outcomes.json")
        env = dict(os.environ, FASTPAR_SUITE_BACKEND=backend, FASTPAR_SUITE_START=start, WORLD_SIZE=str(world),
                   TEMP_DIR=tmp, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
                   FASTPAR_SUITE_AS=as_name, FASTPAR_SUITE_TESTS=",".join(tests or []))
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        os.makedirs(os.path.join(tmp, "barrier"), exist_ok=True)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", out_json] + (["-k", pattern] if pattern else [])
        t0 = time.monotonic()
        log = os.path.join(tmp, "log")
        with open(log, "w") as f:
            try:
                subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
            except subprocess.TimeoutExpired:
                print(f"[{backend}] stopped after {timeout:.0f} s; results so far are kept", file=sys.stderr)
        shown = backend if as_name == "gloo" else f"{backend} as {as_name}"
        print(f"[{shown}, world size {world}] {time.monotonic() - t0:.0f} s", file=sys.stderr)
        if not os.path.exists(out_json):
            with open(log) as f:
                sys.exit(f"{backend}: the suite produced no results:\n{f.read()[-4000:]}")
        with open(out_json) as f:
            return json.load(f)


def beyond_gloo(gloo: dict) -> dict[str, list[str]]:
    """The tests gloo skipped for a feature only another backend's tests
    cover (OTHER_BACKEND_FEATURES), by the name to run them as."""
    found: dict[str, list[str]] = {}
    for name, (status, text) in sorted(gloo.items()):
        for reason, as_name in OTHER_BACKEND_FEATURES.items():
            if status == "skip" and reason.search(text):
                found.setdefault(as_name, []).append(name)
    return found


def report_beyond(world: int, runs: dict[str, dict]) -> None:
    for as_name, outcomes in runs.items():
        passed = sorted(n for n, (status, _) in outcomes.items() if status == "pass")
        print(f"world size {world}: of the {len(outcomes)} tests gloo skips for a feature it lacks (run on fastpar "
              f"as '{as_name}'), fastpar passes {len(passed)}")
        for n, (status, text) in sorted(outcomes.items()):
            if status != "pass":
                print(f"  {n}: [{status}] {text}")


def compare(world: int, gloo: dict, fastpar: dict, csv_path: str | None, beyond: dict | None = None) -> int:
    names = sorted(set(gloo) | set(fastpar))
    status = lambda d, n: d.get(n, ["missing", ""])[0]  # noqa: E731
    run = [n for n in names if "skip" not in (status(gloo, n), status(fastpar, n))
           or status(gloo, n) != status(fastpar, n)]
    gloo_pass = [n for n in names if status(gloo, n) == "pass"]
    regressions = [n for n in gloo_pass if status(fastpar, n) != "pass"]
    extra = [n for n in names if status(fastpar, n) == "pass" and status(gloo, n) != "pass"]
    both_skip = sum(1 for n in names if status(gloo, n) == status(fastpar, n) == "skip")
    print(f"world size {world}: gloo passes {len(gloo_pass)}, fastpar passes "
          f"{len(gloo_pass) - len(regressions)} of them; {both_skip} skip on both")
    print(f"fastpar fails {len(regressions)} tests that gloo passes (of {len(run)} run)")
    for n in regressions:
        print(f"  {n}: [{status(fastpar, n)}] {fastpar.get(n, ['', ''])[1]}")
    artifacts = [n for n in regressions if n in HARNESS_ARTIFACTS]
    for n in artifacts:
        print(f"  ({n} fails by this harness's doing: it {HARNESS_ARTIFACTS[n]})")
    if extra:
        print(f"fastpar passes {len(extra)} tests that gloo does not: {', '.join(extra)}")
    if csv_path:
        with open(csv_path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["world_size", "test", "gloo", "fastpar", "gloo_detail", "fastpar_detail"])
            for n in names:
                g, p = gloo.get(n, ["missing", ""]), fastpar.get(n, ["missing", ""])
                for outcomes in (beyond or {}).values():  # run again under another backend's name
                    p = outcomes.get(n, p)
                w.writerow([world, n, g[0], p[0], g[1], p[1]])
        print(f"wrote {csv_path}")
    return len(regressions)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("-k", dest="pattern", help="only tests whose name contains this")
    ap.add_argument("--csv", help="write every test's outcome here")
    ap.add_argument("--start-method", choices=["fork", "spawn"], default="fork")
    ap.add_argument("--timeout", type=float, default=7200, help="seconds per backend")
    ap.add_argument("--child", metavar="OUT_JSON", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return run_child(args.child, args.pattern)
    if args.world_size < 2:
        ap.error("--world-size must be at least 2 (the suite's tests need peers)")
    results = {b: run_backend(b, args.world_size, args.pattern, args.start_method, args.timeout)
               for b in ("gloo", "fastpar")}
    beyond = {as_name: run_backend("fastpar", args.world_size, None, args.start_method, args.timeout, as_name, tests)
              for as_name, tests in beyond_gloo(results["gloo"]).items()}
    compare(args.world_size, results["gloo"], results["fastpar"], args.csv, beyond)
    report_beyond(args.world_size, beyond)
    return 0


if __name__ == "__main__":
    sys.exit(main())
