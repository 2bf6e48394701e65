"""examples/tensor_parallel_inference.py end to end on 2 processes (torchrun):
every mode's logits match the 1-process model (the example asserts it) and
the table names every mode."""
import os
import subprocess
import sys

import pytest

from dist_harness import ROOT, child_env


@pytest.mark.usefixtures("no_leftover_segments")
def test_tensor_parallel_example_matches_one_process():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "tensor_parallel_inference.py"), "--quick"],
                         env=child_env(), capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    for mode in ("1 process", "gloo", "fastpar", "fastpar direct"):
        assert f"\n{mode} " in out.stdout, out.stdout
    assert "outputs match the 1-process model in every mode" in out.stdout
