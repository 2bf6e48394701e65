"""Where the CUDA toolkit is, for setup.py and scripts/check_torch_compat.py."""
import glob
import os
import shutil
import subprocess
import sys


def find_cuda_home():
    """CUDA_HOME / CUDA_PATH if set, else a toolkit directory holding bin/nvcc and
    include/cuda_runtime.h. torch guesses CUDA_HOME from `which nvcc`, which fails
    when nvcc is a wrapper script outside the toolkit (as on our CI machines), so
    the real toolkit behind the nvcc on the PATH comes first."""
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        return os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = ["/usr/local/cuda"] + sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    for c in candidates:
        if os.path.exists(os.path.join(c, "bin", "nvcc")) and os.path.exists(
            os.path.join(c, "include", "cuda_runtime.h")
        ):
            return c
    return None


def nvidia_wheel_includes():
    """CUDA builds of torch from PyPI ship some headers they include (cusparse.h,
    cublas_v2.h, ...) inside the nvidia-* wheels, not in the toolkit."""
    out = []
    for p in sys.path:
        out += glob.glob(os.path.join(p, "nvidia", "cu*", "include"))
        out += glob.glob(os.path.join(p, "nvidia", "*", "include"))
    return sorted(set(d for d in out if os.path.isdir(d)))


def is_cuda_source(path):
    """The one rule for what joins only a CUDA build: every .cu, and every .cpp
    in a folder named cuda_* (csrc/core/transport/cuda_ipc/) or named cuda_*.cpp
    itself (csrc/torch/distributed/cuda_engine.cpp). tests/tooling/test_layers.py
    holds every source that includes a CUDA header to it."""
    parts = path.replace(os.sep, "/").split("/")
    return path.endswith(".cu") or any(p.startswith("cuda_") for p in parts)


def nvcc_has_option(cuda_home, option):
    """Whether the nvcc of `cuda_home` lists `option` (e.g. "--split-compile")
    in its --help: options newer than the oldest toolkit we build with."""
    try:
        out = subprocess.run([os.path.join(cuda_home, "bin", "nvcc"), "--help"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return f"{option} " in out
