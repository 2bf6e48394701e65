"""Whether fastpar._C was built for the torch this process runs.

A C++ extension works only with the torch (version and C++ ABI) it was
compiled against; with another it fails at import with an undefined symbol,
or worse later. setup.py writes fastpar/_build_info.py beside the extension
(the torch version and _GLIBCXX_USE_CXX11_ABI it built against, and the
extension's file name and size); this module compares that record with the
running torch before the extension is loaded, and turns an undefined-symbol
ImportError into the same message. Nothing here loads the extension.
"""
import os
import runpy
import sys

import torch

RECORD_FILE = "_build_info.py"


def running() -> dict:
    """The torch this process runs: its version and C++ ABI."""
    return {"torch": str(torch.__version__), "abi": int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))}


def read_record(package_dir: str):
    """The build record in `package_dir`, or None when there is none or it
    does not describe the extension beside it (another file was copied over
    the extension: its size differs from the recorded one)."""
    path = os.path.join(package_dir, RECORD_FILE)
    if not os.path.exists(path):
        return None
    rec = runpy.run_path(path)
    try:
        if os.path.getsize(os.path.join(package_dir, rec["EXTENSION"])) != rec["EXTENSION_BYTES"]:
            return None
    except (OSError, KeyError):
        return None
    return {"torch": rec["TORCH_VERSION"], "abi": int(rec["CXX11_ABI"])}


def rebuild_command(package_dir: str) -> str:
    """The command that rebuilds fastpar against the torch of this interpreter."""
    pip = f"{sys.executable} -m pip install --no-build-isolation"
    src = os.path.dirname(os.path.abspath(package_dir))
    if os.path.exists(os.path.join(src, "setup.py")):  # a source checkout (editable or in place)
        return f"{pip} -e {src}"
    return f"{pip} <fastpar's source directory>"


def _describe(d: dict) -> str:
    return f"torch {d['torch']} (_GLIBCXX_USE_CXX11_ABI={d['abi']})"


def mismatch_message(record, run: dict, package_dir: str, cause: str = "") -> str:
    built = _describe(record) if record else "an unrecorded torch (no fastpar/_build_info.py beside the extension)"
    runs = "the torch this process runs, yet fails to load" if record == run else f"but this process runs {_describe(run)}"
    return (f"fastpar's extension in {package_dir} was built for {built}, {runs}"
            f"{': ' + cause if cause else ''}. A C++ extension runs only with the torch it was compiled against. "
            f"Rebuild it against the torch you run: `{rebuild_command(package_dir)}` (without "
            f"--no-build-isolation pip compiles against whatever torch it downloads for the build, not yours).")


def check(package_dir: str) -> None:
    """Raise ImportError when the build record names another torch version or ABI."""
    record, run = read_record(package_dir), running()
    if record is not None and record != run:
        raise ImportError(mismatch_message(record, run, package_dir))


def explain(err: ImportError, package_dir: str) -> ImportError:
    """`err` from importing the extension: an undefined symbol (the sign of a
    build for another torch) becomes the mismatch message; anything else is
    returned unchanged."""
    if "undefined symbol" not in str(err):
        return err
    return ImportError(mismatch_message(read_record(package_dir), running(), package_dir, cause=str(err)))
