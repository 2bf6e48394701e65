"""The folders of csrc/ are the layers, and every #include runs one way.

csrc/core (torch-free), lowest layer first; a file may include its own layer
and the layers below it, never one above:

    kernels/     element math and loops: know nothing of ranks or memory
    transport/   memory, segments, handles, the flag protocol, call descriptors
    algorithms/  schedules (*_slots.h, ring_schedule.h) over an abstract transport
    executors/   a schedule bound to a transport: host code and the device code
                 (kernels that walk a schedule) it launches

csrc/torch (the only code that includes torch) may include csrc/core; csrc/core
never includes csrc/torch. docs/architecture.md draws the same picture.
"""
import os
import re
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import cuda_toolkit  # noqa: E402

CORE_LAYERS = ["kernels", "transport", "algorithms", "executors"]
SOURCE_SUFFIXES = (".h", ".cpp", ".cu", ".cuh", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SYSTEM_INCLUDE = re.compile(r'^\s*#\s*include\s+<([^>]+)>', re.M)


def _sources(under):
    for dirpath, _, names in os.walk(os.path.join(ROOT, under)):
        for n in sorted(names):
            if n.endswith(SOURCE_SUFFIXES):
                yield os.path.relpath(os.path.join(dirpath, n), ROOT)


def _resolve(src, inc):
    """The repository path an #include "..." names: relative to the file, or to
    csrc/ (the include root of the CMake build)."""
    for base in (os.path.dirname(src), "csrc"):
        p = os.path.normpath(os.path.join(base, inc))
        if os.path.exists(os.path.join(ROOT, p)):
            return p
    return None


def _layer(path):
    parts = path.split("/")
    if parts[:2] == ["csrc", "core"] and len(parts) > 3:
        return parts[2]
    return None


def _includes(src):
    with open(os.path.join(ROOT, src)) as f:
        text = f.read()
    return [(inc, _resolve(src, inc)) for inc in INCLUDE.findall(text)]


def test_every_core_file_sits_in_a_layer():
    stray = [s for s in _sources("csrc/core") if _layer(s) not in CORE_LAYERS]
    assert not stray, f"files of csrc/core outside the layers {CORE_LAYERS}: {stray}"


def test_core_includes_run_down_the_layers():
    against = []
    for src in _sources("csrc/core"):
        rank = CORE_LAYERS.index(_layer(src))
        for inc, path in _includes(src):
            assert path is not None, f"{src}: #include \"{inc}\" names no file"
            assert path.startswith("csrc/core/"), f"{src} includes {path}: csrc/core never includes outside itself"
            if CORE_LAYERS.index(_layer(path)) > rank:
                against.append(f"{src} ({_layer(src)}) includes {path} ({_layer(path)})")
    assert not against, "includes against the layers (kernels < transport < algorithms < executors):\n" + "\n".join(
        against)


def test_torch_layer_includes_resolve_and_never_leave_csrc():
    for src in _sources("csrc/torch"):
        for inc, path in _includes(src):
            if path is None:
                continue  # a torch or system header spelled with quotes is not ours
            assert path.startswith("csrc/"), f"{src} includes {path}, outside csrc/"


def test_only_the_python_module_includes_torch_extension_h():
    # <torch/extension.h> (all of ATen, autograd, the C++ frontend and
    # pybind11) is most of the compile time of a source that includes it: the
    # layer's other files include the headers they use (docs/measurements.md).
    users = [src for src in _sources("csrc")
             if "torch/extension.h" in SYSTEM_INCLUDE.findall(open(os.path.join(ROOT, src)).read())]
    assert users == ["csrc/torch/module.cpp"], users


def _includes_cuda(src):
    with open(os.path.join(ROOT, src)) as f:
        text = f.read()
    names = SYSTEM_INCLUDE.findall(text) + INCLUDE.findall(text)
    return any(n.startswith(("cuda", "ATen/cuda", "c10/cuda")) for n in names)


@pytest.mark.parametrize("src", [s for s in _sources("csrc") if s.endswith(".cpp")])
def test_a_cpp_that_includes_cuda_headers_is_built_as_cuda(src):
    # setup.py builds .cpp files it does not take for CUDA sources in the
    # CPU-only build too, where no CUDA header exists: such a file must follow
    # the naming rule or the CPU-only build breaks.
    if _includes_cuda(src):
        assert cuda_toolkit.is_cuda_source(src), (
            f"{src} includes a CUDA header but cuda_toolkit.is_cuda_source() does not take it for a "
            "CUDA source: put it in a cuda_* folder or name it cuda_*.cpp")


def test_the_cuda_rule():
    assert cuda_toolkit.is_cuda_source("csrc/core/transport/cuda_ipc/ipc_endpoint.cpp")
    assert cuda_toolkit.is_cuda_source("csrc/torch/ops/cuda_ops.cpp")
    assert cuda_toolkit.is_cuda_source("csrc/core/kernels/cuda_reduce.cu")
    assert not cuda_toolkit.is_cuda_source("csrc/torch/ops/cpu_ops.cpp")
    # a name that merely contains "cuda" is not the rule (it was, once)
    assert not cuda_toolkit.is_cuda_source("csrc/torch/distributed/no_cuda_fallback.cpp")
