"""Builds and runs tests/cpp/test_flag_protocol.cpp: the cross-rank flag
protocol on its own (threads as ranks), without torch or shared memory."""
import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "cpp", "test_flag_protocol.cpp")


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_flag_protocol(tmp_path):
    exe = tmp_path / "test_flag_protocol"
    subprocess.run(["g++", "-std=c++17", "-O2", "-pthread", SRC, "-o", str(exe)], check=True, timeout=300)
    p = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "all tests passed" in p.stdout
