"""docs/c10d_methods.md lists every virtual method of the installed torch's
c10d::Backend, and the rows it marks 'fastpar' are the methods fastpar's
backend overrides: a new torch release shows its new methods here."""
import os
import re

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADER = os.path.join(os.path.dirname(torch.__file__), "include", "torch", "csrc", "distributed", "c10d",
                      "Backend.hpp")


def declared(text):
    return set(re.findall(r"virtual\s+[\w:<>,\s\*&]+?\b(\w+)\s*\(", text))


def table():
    rows = {}
    with open(os.path.join(ROOT, "docs", "c10d_methods.md")) as f:
        for line in f:
            m = re.match(r"\| `(\w+)` \| (\w+) \|", line)
            if m:
                rows[m.group(1)] = m.group(2)
    return rows


def test_every_method_of_the_installed_torch_is_in_the_table():
    with open(HEADER) as f:
        missing = declared(f.read()) - set(table())
    assert not missing, f"c10d::Backend methods of torch {torch.__version__} missing from docs/c10d_methods.md: " \
                        f"{sorted(missing)}"


def test_the_methods_marked_fastpar_are_the_ones_the_backend_overrides():
    with open(os.path.join(ROOT, "csrc", "torch", "distributed", "backend.h")) as f:
        code = "".join(line for line in f if not line.lstrip().startswith(("#", "//")))
    # every overriding method but the destructor (~Backend), which is no c10d call
    overridden = set(re.findall(r"(?<!~)\b(\w+)\([^;{]*\)\s*(?:const\s*)?override", code))
    assert len(overridden) >= 20, overridden
    marked = {name for name, status in table().items() if status == "fastpar"}
    assert marked == overridden, f"marked but not overridden: {sorted(marked - overridden)}; " \
                                 f"overridden but not marked: {sorted(overridden - marked)}"
