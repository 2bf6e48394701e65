"""scripts/check_torch_compat.py: how it reads an older torch's C++ standard.
The compile check itself runs in tests/run.sh (it downloads a torch wheel)."""
import os
import sys

import torch.utils.cpp_extension

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import check_torch_compat  # noqa: E402


def test_reads_the_standard_of_old_and_new_torch():
    # the lines as torch 2.11 and torch 2.14 write them
    assert check_torch_compat.cxx_standard("    common_cflags += ['-std=c++17', '-fPIC']\n") == "c++17"
    assert check_torch_compat.cxx_standard("    common_cflags += ['-std=c++20', '-fPIC']\n") == "c++20"
    assert check_torch_compat.cxx_standard("cflags = ['-std=c++17']") is None


def test_the_installed_torch_states_the_standard_fastpar_was_built_with():
    with open(torch.utils.cpp_extension.__file__) as f:
        std = check_torch_compat.cxx_standard(f.read())
    assert std in ("c++17", "c++20")
    log = os.path.join(ROOT, ".venv", "fastpar-build.log")  # scripts/setup.sh's build
    if os.path.exists(log):
        with open(log) as f:
            compile_lines = [line for line in f if " -c " in line and "csrc/" in line]
        assert compile_lines and all(f"-std={std}" in line for line in compile_lines)


def test_without_nvcc_it_skips_and_under_ci_fails(monkeypatch, capsys):
    """No silent pass in CI: a check that cannot run there is a failure naming what is missing."""
    import pytest

    monkeypatch.setattr(check_torch_compat.cuda_toolkit, "find_cuda_home", lambda: None)
    monkeypatch.setattr(sys, "argv", ["check_torch_compat.py"])
    monkeypatch.delenv("CI", raising=False)
    assert check_torch_compat.main() == 0
    assert "SKIPPED no CUDA toolkit (nvcc)" in capsys.readouterr().out
    monkeypatch.setenv("CI", "true")
    with pytest.raises(SystemExit) as e:
        check_torch_compat.main()
    assert "FAILED (CI=true: no skipping): no CUDA toolkit (nvcc)" in str(e.value.code)
