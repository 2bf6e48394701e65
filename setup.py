"""Builds fastpar._C, the collective kernels.

CUDA sources are compiled whenever nvcc and a CUDA build of torch are present,
whether or not a GPU is (a GPU is never needed to compile). Override with
FASTPAR_CUDA=0 (CPU only) or FASTPAR_CUDA=1 (CUDA required: fail if impossible).
Architectures follow TORCH_CUDA_ARCH_LIST, default "8.0;9.0"; suffixed entries
take torch's syntax ("9.0a" -> sm_90a, "8.0+PTX" adds compute_80 PTX). The
plain archs' cubins are all made from the lowest one's PTX
(cuda_archs.gencode_flags).

The toolchain must share torch's C++ runtime (scripts/toolchain_guard.py):
before compiling, a probe library built with the same compiler, flags and
linker must depend on libstdc++.so.6 as torch does and format `ostream << 42`
beside torch; after linking, fastpar._C itself must depend on libstdc++.so.6
and define none of libstdc++'s symbols. Otherwise the build stops with the
cause and the fix (e.g. `CXX=/usr/bin/g++`), instead of producing an
extension that crashes at its first error message.

Release builds carry no debug information: Python's sysconfig CFLAGS (which
torch's build puts on every C++ compile line) hold `-g`, and the extension grew
to ~94 MiB for one GPU architecture with it; `-g0` last on the C++ lines and
on nvcc's host-compiler lines takes it off. FASTPAR_DEBUG_INFO=1 keeps it (and
adds `-g` for the host side of .cu files) for debugging with gdb.

Install with `pip install --no-build-isolation .` so the extension is built
against the torch you will import (its C++ ABI must match).
"""
import glob
import os
import sys

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import cuda_archs  # noqa: E402
import cuda_toolkit  # noqa: E402
import toolchain_guard  # noqa: E402


_cuda_home = cuda_toolkit.find_cuda_home()
if _cuda_home:
    os.environ["CUDA_HOME"] = _cuda_home
# torch reads the list itself (suffixes such as 9.0a and +PTX included) but
# rejects empty entries ("9.0;", "9.0; 10.0"): hand it the normalized list.
os.environ["TORCH_CUDA_ARCH_LIST"] = cuda_archs.normalize_arch_list(
    os.environ.get("TORCH_CUDA_ARCH_LIST", "") or "8.0;9.0")

import torch  # noqa: E402  (after CUDA_HOME is set: cpp_extension reads it at import)
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension  # noqa: E402

if "pip-build-env" in torch.__file__:
    print(f"fastpar: WARNING: building against torch {torch.__version__} from pip's isolated build environment "
          f"({os.path.dirname(torch.__file__)}); importing fastpar with any other torch fails. "
          "Install with `pip install --no-build-isolation .` to build against the torch you run.")

TORCH_RUNTIME = toolchain_guard.torch_runtime()
# torch's C++ ABI, stated on every compile line (last, so it wins over CXXFLAGS
# or a compiler default); torch >= 2.7 no longer passes it itself.
ABI_DEFINE = toolchain_guard.abi_define(TORCH_RUNTIME)


def _want_cuda():
    flag = os.environ.get("FASTPAR_CUDA", "").strip()
    possible = torch.version.cuda is not None and _cuda_home is not None
    if flag == "0":
        return False
    if flag == "1":
        if not possible:
            sys.exit(
                "FASTPAR_CUDA=1 but a CUDA build is impossible: "
                f"torch.version.cuda={torch.version.cuda!r}, nvcc toolkit={_cuda_home!r}"
            )
        return True
    if flag:
        sys.exit(f"FASTPAR_CUDA must be 0 or 1, got {flag!r}")
    return possible


def _debug_info():
    flag = os.environ.get("FASTPAR_DEBUG_INFO", "").strip()
    if flag not in ("", "0", "1"):
        sys.exit(f"FASTPAR_DEBUG_INFO must be 0 or 1, got {flag!r}")
    return flag == "1"


def _sources(cuda):
    """Every source under csrc/, CUDA ones (cuda_toolkit.is_cuda_source) only in a CUDA build.
    Globbing keeps new transports from touching this file."""
    srcs = sorted(glob.glob("csrc/**/*.cpp", recursive=True)) + sorted(glob.glob("csrc/**/*.cu", recursive=True))
    return [s for s in srcs if cuda or not cuda_toolkit.is_cuda_source(s)]


def _extension():
    cuda = _want_cuda()
    debug = _debug_info()
    # -g0/-g last: the flags from sysconfig come first on the line, the last -g* wins
    host_debug = "-g" if debug else "-g0"
    # the C++ standard is torch's choice (C++20 for 2.14)
    cxx = ["-O3", "-fno-strict-aliasing", ABI_DEFINE, host_debug]
    print(f"fastpar: building {'CPU + CUDA' if cuda else 'CPU-only'} extension "
          f"(torch {torch.__version__}, CUDA_HOME={_cuda_home}, "
          f"TORCH_CUDA_ARCH_LIST={os.environ['TORCH_CUDA_ARCH_LIST']}, "
          f"{'with debug info (FASTPAR_DEBUG_INFO=1)' if debug else 'no debug info'})")
    if not cuda:
        return CppExtension("fastpar._C", _sources(False), extra_compile_args={"cxx": cxx})
    # -lineinfo (device line tables, a few %) stays: compute-sanitizer and
    # Nsight name the source line of a kernel that traps or stalls
    nvcc = ["-O3", "--expt-relaxed-constexpr", "-lineinfo", ABI_DEFINE, "-Xcompiler", host_debug]
    # Each one-kernel IPC file holds up to 40 kernel instances (dtypes x ops).
    # --split-compile=0 runs nvcc's optimizer and ptxas on every core, so a
    # file's kernels compile in parallel.
    if cuda_toolkit.nvcc_has_option(_cuda_home, "--split-compile"):
        nvcc.append("--split-compile=0")
    # One PTX for every plain arch (scripts/cuda_archs.py); with these flags
    # present torch adds none of its own. Named arches ([]) stay torch's.
    nvcc += cuda_archs.gencode_flags(os.environ["TORCH_CUDA_ARCH_LIST"])
    return CUDAExtension(
        "fastpar._C",
        _sources(True),
        include_dirs=cuda_toolkit.nvidia_wheel_includes(),
        define_macros=[("FASTPAR_WITH_CUDA", "1")],
        extra_compile_args={"cxx": cxx[:-1] + ["-DFASTPAR_WITH_CUDA=1", host_debug], "nvcc": nvcc},
    )


def _write_build_record(so_path):
    """fastpar/_build_info.py beside `so_path`: the torch this extension was
    compiled against, and the extension's name and size (a record whose size
    differs from the extension's describes another build and is ignored)."""
    path = os.path.join(os.path.dirname(so_path), "_build_info.py")
    text = ("# Written by setup.py at build time: the torch fastpar._C was compiled against.\n"
            f"TORCH_VERSION = {str(torch.__version__)!r}\n"
            f"CXX11_ABI = {TORCH_RUNTIME['abi']}\n"
            f"EXTENSION = {os.path.basename(so_path)!r}\n"
            f"EXTENSION_BYTES = {os.path.getsize(so_path)}\n")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    print(f"fastpar: build record {path}: torch {torch.__version__}, _GLIBCXX_USE_CXX11_ABI={TORCH_RUNTIME['abi']}")


class GuardedBuildExtension(BuildExtension.with_options(use_ninja=True)):
    """torch's BuildExtension, refusing a toolchain that does not share torch's
    C++ runtime: a probe before compiling, the linked extension after."""

    def build_extensions(self):
        if not sys.platform.startswith("linux"):  # the guard reads ELF files; fastpar targets Linux
            print(f"fastpar: toolchain check skipped on {sys.platform}")
            return super().build_extensions()
        compilers = toolchain_guard.used_compilers(self.compiler)
        try:
            toolchain_guard.check_toolchain(toolchain_guard.ccompiler_builder(self.compiler, [ABI_DEFINE]),
                                            compilers, TORCH_RUNTIME)
        except toolchain_guard.ToolchainError as e:
            sys.exit(str(e))
        print(f"fastpar: toolchain check passed ({toolchain_guard.describe(compilers)}: links {TORCH_RUNTIME['library']} "
              f"dynamically, _GLIBCXX_USE_CXX11_ABI={TORCH_RUNTIME['abi']} as torch)")
        super().build_extensions()

    def run(self):
        super().run()
        # The build record fastpar/__init__.py reads before loading the
        # extension (fastpar/_build_check.py): beside the extension in the build
        # directory (what a wheel installs) and, for --inplace and editable
        # installs, beside the copy in the source tree.
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            filename = self.get_ext_filename(self.get_ext_fullname(ext.name))
            built = os.path.join(self.build_lib, filename)
            places = [built]
            if self.inplace:
                places.append(os.path.join(build_py.get_package_dir("fastpar"), os.path.basename(filename)))
            for so in places:
                if os.path.exists(so):
                    _write_build_record(so)

    def build_extension(self, ext):
        super().build_extension(ext)
        if not sys.platform.startswith("linux"):
            return
        path = self.get_ext_fullpath(ext.name)
        try:
            toolchain_guard.check_library(path, TORCH_RUNTIME)
        except toolchain_guard.ToolchainError as e:
            os.remove(path)  # never leave a crashing extension where `import fastpar` finds it
            sys.exit(str(e))


setup(
    ext_modules=[_extension()],
    cmdclass={"build_ext": GuardedBuildExtension},
)
