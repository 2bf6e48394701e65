"""Modules of benchmarks/ for the tests that check them, imported by their
file path. benchmarks/ is never on the tests' sys.path, so no test module
picks up a benchmark's module by its bare name without saying so.

    training = benchmark_module("training")           # the package benchmarks/training
    modes = benchmark_module("training.modes")        # a module of it
    readme_table = benchmark_module("readme_table")   # benchmarks/readme_table.py

A module is registered under the name a benchmark script imports it by (its
file's stem), so a benchmark that imports its sibling gets the same module
object as the test."""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks")


def benchmark_module(name: str) -> ModuleType:
    """The module or package `name` of benchmarks/ ("readme_table",
    "training"), or a module of such a package ("training.modes"), imported
    once."""
    top, _, rest = name.partition(".")
    if top not in sys.modules:
        path = os.path.join(BENCHMARKS, top)
        if os.path.isdir(path):
            spec = importlib.util.spec_from_file_location(top, os.path.join(path, "__init__.py"),
                                                          submodule_search_locations=[path])
        elif os.path.isfile(path + ".py"):
            spec = importlib.util.spec_from_file_location(top, path + ".py")
        else:
            raise ModuleNotFoundError(f"benchmarks/ has no module or package {top!r} (looked for {path}.py and "
                                      f"{path}/)")
        module = importlib.util.module_from_spec(spec)
        sys.modules[top] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[top]
            raise
    found = os.path.abspath(getattr(sys.modules[top], "__file__", None) or "")
    if not found.startswith(BENCHMARKS + os.sep):
        raise ImportError(f"the module {top!r} already imported is {found or 'built in'}, not one of {BENCHMARKS}")
    return importlib.import_module(name) if rest else sys.modules[top]
