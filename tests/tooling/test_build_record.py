"""An extension built for another torch fails at `import fastpar` with both
versions and the command that rebuilds it (fastpar/_build_check.py), from the
record setup.py writes beside the extension; nothing here compiles."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import fastpar
from fastpar import _build_check

PKG = os.path.dirname(os.path.abspath(fastpar.__file__))
RUNNING = {"torch": str(torch.__version__), "abi": int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))}
EXT = "_C.cpython-311-x86_64-linux-gnu.so"


def _fake_package(tmp_path, version, abi, ext_bytes=16, record_bytes=None):
    """A copy of fastpar's Python files with a stand-in extension of
    `ext_bytes` bytes (never loaded: the check runs first) and a record
    naming `version` and `abi`."""
    pkg = tmp_path / "fastpar"
    shutil.copytree(PKG, pkg, ignore=shutil.ignore_patterns("*.so", "_build_info.py", "__pycache__"))
    (pkg / EXT).write_bytes(b"\0" * ext_bytes)
    (pkg / "_build_info.py").write_text(textwrap.dedent(f"""\
        TORCH_VERSION = {version!r}
        CXX11_ABI = {abi}
        EXTENSION = {EXT!r}
        EXTENSION_BYTES = {ext_bytes if record_bytes is None else record_bytes}
        """))
    return pkg


def _import_in_child(tmp_path):
    return subprocess.run([sys.executable, "-c", "import fastpar"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tmp_path), "FASTPAR_AUTOLOAD": "0"})


def test_a_build_for_another_torch_version_fails_at_import_naming_both(tmp_path):
    pkg = _fake_package(tmp_path, "2.0.0+cpu", RUNNING["abi"])
    r = _import_in_child(tmp_path)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: "), r.stderr
    assert f"built for torch 2.0.0+cpu (_GLIBCXX_USE_CXX11_ABI={RUNNING['abi']})" in last, last
    assert f"this process runs torch {RUNNING['torch']} (_GLIBCXX_USE_CXX11_ABI={RUNNING['abi']})" in last, last
    assert f"{sys.executable} -m pip install --no-build-isolation" in last, last
    assert str(pkg) in last, last


def test_a_build_for_the_other_cxx_abi_fails_at_import(tmp_path):
    _fake_package(tmp_path, RUNNING["torch"], 1 - RUNNING["abi"])
    r = _import_in_child(tmp_path)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert f"built for torch {RUNNING['torch']} (_GLIBCXX_USE_CXX11_ABI={1 - RUNNING['abi']}), but" in last, last


def test_a_record_of_another_extension_file_is_ignored(tmp_path):
    # The record's size is not the extension's: it describes another build
    # (an extension copied over), so the check passes it by.
    pkg = _fake_package(tmp_path, "2.0.0", RUNNING["abi"], ext_bytes=16, record_bytes=17)
    assert _build_check.read_record(str(pkg)) is None
    _build_check.check(str(pkg))  # no record that applies: nothing to compare
    (pkg / "_build_info.py").unlink()
    assert _build_check.read_record(str(pkg)) is None
    pkg = _fake_package(tmp_path / "b", "2.0.0", RUNNING["abi"])
    assert _build_check.read_record(str(pkg)) == {"torch": "2.0.0", "abi": RUNNING["abi"]}


def test_check_compares_the_record_with_the_running_torch(monkeypatch):
    monkeypatch.setattr(_build_check, "read_record", lambda d: {"torch": "2.99.0", "abi": RUNNING["abi"]})
    with pytest.raises(ImportError, match=r"built for torch 2\.99\.0 .* but this process runs torch "):
        _build_check.check(PKG)
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    _build_check.check(PKG)  # the same version and ABI: no error


def test_an_undefined_symbol_becomes_the_mismatch_message(monkeypatch):
    monkeypatch.setattr(_build_check, "read_record", lambda d: {"torch": "2.13.0", "abi": RUNNING["abi"]})
    cause = ImportError(f"{PKG}/{EXT}: undefined symbol: _ZN3c106detail14torchCheckFailEPKcS2_jRKSs")
    err = _build_check.explain(cause, PKG)
    assert err is not cause
    msg = str(err)
    assert "built for torch 2.13.0" in msg and f"this process runs torch {RUNNING['torch']}" in msg, msg
    assert "undefined symbol: _ZN3c106detail14torchCheckFail" in msg and "--no-build-isolation" in msg, msg
    # Without a record it still says what runs and how to rebuild.
    monkeypatch.setattr(_build_check, "read_record", lambda d: None)
    msg = str(_build_check.explain(cause, PKG))
    assert "an unrecorded torch" in msg and "--no-build-isolation" in msg, msg
    # Other import errors pass through unchanged.
    other = ImportError("libc10.so: cannot open shared object file")
    assert _build_check.explain(other, PKG) is other


def test_the_rebuild_command_of_a_source_checkout_is_editable():
    cmd = _build_check.rebuild_command(PKG)
    src = os.path.dirname(PKG)
    if os.path.exists(os.path.join(src, "setup.py")):
        assert cmd == f"{sys.executable} -m pip install --no-build-isolation -e {src}"
    else:
        assert cmd == f"{sys.executable} -m pip install --no-build-isolation <fastpar's source directory>"


def test_this_build_recorded_the_torch_it_runs_with():
    rec = fastpar.build_info()["built_for"]
    if rec is None:
        pytest.skip(f"no build record beside {fastpar._C.__file__} (an extension copied in without it)")
    assert rec == RUNNING
