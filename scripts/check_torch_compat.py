"""Compiles fastpar's sources against the headers of another torch release.

CI builds fastpar with torch 2.14.1, but the GPU machine runs torch 2.11.0
(C++17, an older c10d): a name or a C++20 construct that only the newer torch
accepts compiles here and breaks the first build on the GPU, where a build
costs device minutes. This script takes torch's own headers from the release's
wheel (downloaded once with `pip download --no-deps`, cached under
build/torch-compat/) and compiles every source of a CUDA build with them:
the .cpp files with `g++ -fsyntax-only`, the .cu files with `nvcc -ptx` for one
architecture without the device optimizer (host and device code parsed and
instantiated, unoptimized PTX made, no machine code), each with the C++
standard that release's cpp_extension uses.

    python scripts/check_torch_compat.py                 # the GPU machine's torch
    python scripts/check_torch_compat.py 2.12.0 2.13.0   # other releases

Exit status 1 when a source fails to compile (its errors are printed). Without
nvcc, or a wheel that cannot be downloaded (no network), the check is reported
SKIPPED with exit 0, since the GPU check builds on the machine anyway; under
CI=true (as .ci/run sets it) that is a failure instead, exit 1.
"""
import argparse
import concurrent.futures
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import cuda_toolkit  # scripts/, next to this file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, "build", "torch-compat")
# The torch the GPU checks so far ran with (docs/gpu.md): torch 2.11.0+cu130.
GPU_MACHINE_TORCH = "2.11.0"
DEFINES = ["-DFASTPAR_WITH_CUDA=1", "-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=_C",
           "-D_GLIBCXX_USE_CXX11_ABI=1"]


def fetch_headers(version):
    """torch/include and the C++ standard of torch==version; None if the wheel can't be had."""
    dest = os.path.join(CACHE, version)
    std_file = os.path.join(dest, "cxx_std")
    if os.path.exists(std_file):
        return os.path.join(dest, "include"), open(std_file).read().strip()
    wheels = os.path.join(CACHE, "wheels")
    os.makedirs(wheels, exist_ok=True)
    pattern = os.path.join(wheels, f"torch-{version}-*.whl")
    if not glob.glob(pattern):
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", wheels,
                            f"torch=={version}"], capture_output=True, text=True)
        if r.returncode != 0 or not glob.glob(pattern):
            skipped(f"torch {version}: could not download its wheel:\n" + (r.stderr or r.stdout).strip()[-600:])
            return None
    wheel = glob.glob(pattern)[0]
    tmp = dest + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(wheel) as z:
        members = [m for m in z.namelist() if m.startswith("torch/include/")]
        z.extractall(tmp, members)
        ext_py = z.read("torch/utils/cpp_extension.py").decode()
    std = cxx_standard(ext_py)
    if std is None:
        sys.exit(f"check_torch_compat: cannot tell the C++ standard of torch {version} from its cpp_extension.py")
    os.rename(os.path.join(tmp, "torch", "include"), os.path.join(tmp, "include"))
    with open(os.path.join(tmp, "cxx_std"), "w") as f:
        f.write(std)
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(tmp, dest)
    os.remove(wheel)  # the headers are what is kept: 500+ MB less on disk
    return os.path.join(dest, "include"), std


def in_ci():
    return os.environ.get("CI", "").lower() in ("true", "1")


def skipped(why):
    """A check that could not run: SKIPPED, or under CI a failure (exit 1)."""
    if in_ci():
        sys.exit(f"check_torch_compat: FAILED (CI=true: no skipping): {why}")
    print(f"check_torch_compat: SKIPPED {why}")


def cxx_standard(cpp_extension_source):
    """The -std torch's cpp_extension.py passes to every extension compile
    (c++17 up to torch 2.11, c++20 later), or None if the file does not say."""
    m = re.search(r"common_cflags \+= \['-std=(c\+\+\d+)'", cpp_extension_source)
    return m.group(1) if m else None


def sources(suffix):
    """Every csrc/ file with this suffix, relative to the checkout (a CUDA build compiles them all)."""
    found = glob.glob(os.path.join(ROOT, "csrc", "**", "*" + suffix), recursive=True)
    return sorted(os.path.relpath(p, ROOT) for p in found)


def compile_one(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    return r.returncode, (r.stdout + r.stderr).strip()


def check(version, cuda, jobs):
    got = fetch_headers(version)
    if got is None:
        return True
    inc, std = got
    includes = [f"-I{inc}", f"-I{inc}/torch/csrc/api/include", f"-I{cuda}/include",
                f"-I{sysconfig.get_paths()['include']}"] + [f"-I{d}" for d in cuda_toolkit.nvidia_wheel_includes()]
    cxx = os.environ.get("CXX", "g++")
    cmds = {}
    for src in sources(".cpp"):
        cmds[src] = [cxx, "-fsyntax-only", f"-std={std}", "-fPIC"] + DEFINES + includes + [src]
    for src in sources(".cu"):
        # -Xcicc -O0: whether a source compiles shows before NVVM's optimizer,
        # which is nearly all of an optimized -ptx run for the one-kernel files.
        cmds[src] = [os.path.join(cuda, "bin", "nvcc"), f"-std={std}", "-arch=sm_90", "--expt-relaxed-constexpr",
                     "-ptx", "-Xcicc", "-O0", "-o", os.devnull] + DEFINES + includes + [src]
    print(f"check_torch_compat: torch {version} ({std}): {len(cmds)} sources", flush=True)
    failed = []
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for src, (rc, out) in zip(cmds, pool.map(compile_one, cmds.values())):
            if rc != 0:
                failed.append(src)
                print(f"--- {src} does not compile against torch {version}:\n{out[-4000:]}")
    print(f"check_torch_compat: torch {version}: " + (f"FAILED {len(failed)}: {', '.join(failed)}" if failed
                                                      else f"all {len(cmds)} sources compile"))
    return not failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("versions", nargs="*", default=[GPU_MACHINE_TORCH])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    cuda = cuda_toolkit.find_cuda_home()
    if cuda is None:
        skipped("no CUDA toolkit (nvcc) here, so no CUDA build to check")
        return 0
    ok = all([check(v, cuda, args.jobs) for v in args.versions])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
