"""The CUDA kernels and the cuda_p2p ring executor, compiled for the host
against a fake CUDA runtime (tests/cpp/cuda_host_emulation) and run thread by
thread: their index math, 16-byte/scalar paths, aliasing and ring schedule are
checked bit for bit against the CPU code on any machine with a C++20 compiler,
GPU or not. (Streams, events, peer access and IPC still need real GPUs:
test_cuda.py, test_cuda_ipc.py.)"""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.join(ROOT, "tests", "cpp", "cuda_host_emulation")


def test_cuda_kernels_and_ring_executor_on_host(tmp_path):
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        pytest.skip("no C++ compiler")
    exe = str(tmp_path / "kernels_and_ring_test")
    build = subprocess.run(
        [cxx, "-std=c++20", "-O1", "-I", os.path.join(HERE, "fake_cuda"), "-I", ROOT,
         os.path.join(HERE, "kernels_and_ring_test.cpp"), "-o", exe],
        capture_output=True, text=True,
    )
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([exe], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    assert " 0 failures" in run.stdout
