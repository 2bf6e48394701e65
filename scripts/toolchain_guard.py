"""Refuses a build of fastpar._C whose C++ runtime does not match torch's.

Why: torch's libraries use the shared libstdc++.so.6. A compiler that links
libstdc++ statically (a GCC installed under /opt whose libstdc++.so is absent,
or `-static-libstdc++` in LDFLAGS) puts a second, private copy of iostreams
and locales inside the extension. Some of its calls then bind to torch's copy
and some to its own, and `ostream << integer` stops formatting (a CPU build's
error messages stop at "tensors[1] has ") or segfaults (every message and the
CUDA IPC rendezvous on a GPU machine). The build itself reports success.

So setup.py, before compiling anything, builds a tiny probe library with the
same compiler, flags and linker the extension will use and checks it
(`check_toolchain`); after linking it checks the extension itself
(`check_library`). Both read the ELF file (elf_info.py); the probe is also
loaded next to torch in a child process to see its `ostream << 42` work.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import elf_info  # noqa: E402

PROBE_SOURCE = r"""
#include <cstring>
#include <sstream>
#include <string>

// Which C++ ABI this translation unit was compiled for, as a symbol name the
// guard reads back from the library (no need to run it).
#if defined(_GLIBCXX_USE_CXX11_ABI) && _GLIBCXX_USE_CXX11_ABI
extern "C" int fastpar_probe_abi_cxx11() { return 1; }
#elif defined(_GLIBCXX_USE_CXX11_ABI)
extern "C" int fastpar_probe_abi_old() { return 0; }
#else
extern "C" int fastpar_probe_abi_not_libstdcxx() { return -1; }
#endif

// The call that breaks first when libstdc++ is linked in statically.
extern "C" int fastpar_probe_format(char* out, int cap) {
  std::ostringstream s;
  s << "n=" << 42 << " m=" << 17L;
  const std::string r = s.str();
  std::strncpy(out, r.c_str(), cap - 1);
  return int(r.size());
}
"""
PROBE_EXPECTED = "n=42 m=17"
ABI_MARKERS = {"fastpar_probe_abi_cxx11": 1, "fastpar_probe_abi_old": 0, "fastpar_probe_abi_not_libstdcxx": None}

# Symbols only libstdc++ itself defines (non-template members of std::locale,
# std::ios_base, std::ostream/istream, the exception ABI): a library that
# defines them carries its own copy of the C++ runtime. Template instances such
# as std::vector<T> members are fine and deliberately not listed.
RUNTIME_SYMBOL_PREFIXES = ("_ZNSt6locale", "_ZNSt8ios_base", "_ZNSo", "_ZNSi", "__cxa_throw",
                           "__cxa_allocate_exception", "__gxx_personality_v0")

# Environment variables whose words reach the compile or link command lines.
FLAG_VARIABLES = ("CXX", "CC", "LDSHARED", "LDCXXSHARED", "LDFLAGS", "CFLAGS", "CXXFLAGS", "CPPFLAGS")


class ToolchainError(RuntimeError):
    """The build would produce an extension that does not share torch's C++ runtime."""


@dataclass
class LibraryFacts:
    path: str
    needed: List[str]
    runtime_symbols: List[str]  # libstdc++'s own symbols defined inside this library
    abi: Optional[int] = None  # _GLIBCXX_USE_CXX11_ABI it was compiled with (probes only)
    formatted: Optional[str] = None  # what `ostream << 42` wrote with torch loaded (probes only)
    problems: List[str] = field(default_factory=list)


def torch_runtime() -> Dict[str, object]:
    """torch's C++ runtime: the libstdc++/libc++ that libc10.so needs (None if
    torch links it in statically) and the _GLIBCXX_USE_CXX11_ABI it was built with."""
    import torch

    libc10 = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so")
    needed = elf_info.needed(libc10) if os.path.exists(libc10) else []
    lib = next((n for n in needed if n.startswith(("libstdc++.so", "libc++.so"))), None)
    return {"library": lib, "abi": int(bool(torch._C._GLIBCXX_USE_CXX11_ABI)), "libc10": libc10}


def abi_define(runtime: Dict[str, object]) -> str:
    """The define setup.py passes to every C++ and nvcc compile: torch's ABI,
    stated explicitly so a compiler default or a CXXFLAGS entry cannot change it
    (it comes last on the command line, so it wins)."""
    return f"-D_GLIBCXX_USE_CXX11_ABI={runtime['abi']}"


def library_facts(path: str, runtime: Dict[str, object]) -> LibraryFacts:
    """What the ELF file says, and the problems that follow (empty: it matches torch)."""
    with elf_info.ElfFile(path) as f:
        needed, defined = f.needed(), f.defined_symbols()
    facts = LibraryFacts(path, needed, sorted(s for s in defined if s.startswith(RUNTIME_SYMBOL_PREFIXES)))
    markers = [ABI_MARKERS[s] for s in ABI_MARKERS if s in defined]
    facts.abi = markers[0] if markers else None
    lib = runtime["library"]
    if lib and lib not in needed:
        facts.problems.append(
            f"it does not depend on {lib} (it needs {', '.join(needed) or 'nothing'}), but torch's "
            f"{os.path.basename(str(runtime['libc10']))} does: libstdc++ was linked in statically")
    if facts.runtime_symbols:
        facts.problems.append(
            f"it defines {len(facts.runtime_symbols)} of libstdc++'s own symbols (e.g. "
            f"{', '.join(facts.runtime_symbols[:3])}): a private copy of the C++ runtime beside torch's")
    return facts


def check_library(path: str, runtime: Optional[Dict[str, object]] = None) -> None:
    """After linking: raises ToolchainError unless `path` shares torch's C++ runtime."""
    runtime = runtime or torch_runtime()
    facts = library_facts(path, runtime)
    if facts.problems:
        raise ToolchainError(
            f"fastpar: the extension just linked, {path}, does not share torch's C++ runtime:\n  - "
            + "\n  - ".join(facts.problems)
            + "\n  It would import and then fail at the first `ostream << integer` (truncated error "
              "messages, or a segfault).\n" + fix_hint(os.environ))


def run_probe(path: str) -> str:
    """Loads the probe next to torch (whose libstdc++.so.6 is then loaded, as
    when fastpar is imported) in a child process, since a broken runtime may
    crash; returns what its `ostream << 42` wrote, or how the process ended."""
    code = ("import ctypes, sys, torch\n"
            "lib = ctypes.CDLL(sys.argv[1])\n"
            "buf = ctypes.create_string_buffer(64)\n"
            "lib.fastpar_probe_format(buf, 64)\n"
            "sys.stdout.write(buf.value.decode())\n")
    r = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        how = f"signal {-r.returncode}" if r.returncode < 0 else f"exit code {r.returncode}"
        return f"<crashed: {how}; {r.stderr.strip()[-300:]}>"
    return r.stdout


def probe(build: Callable[[str, str], str], runtime: Dict[str, object], workdir: str) -> LibraryFacts:
    """Builds the probe with `build(source_path, out_dir) -> library_path` and checks it."""
    src = os.path.join(workdir, "fastpar_toolchain_probe.cpp")
    with open(src, "w") as f:
        f.write(PROBE_SOURCE)
    facts = library_facts(build(src, workdir), runtime)
    if facts.abi != runtime["abi"]:
        was = {None: "without libstdc++ (another C++ library)", 0: "with _GLIBCXX_USE_CXX11_ABI=0",
               1: "with _GLIBCXX_USE_CXX11_ABI=1"}[facts.abi]
        facts.problems.append(f"it was compiled {was}, but torch uses _GLIBCXX_USE_CXX11_ABI={runtime['abi']}")
    facts.formatted = run_probe(facts.path)
    if facts.formatted != PROBE_EXPECTED:
        facts.problems.append(f"loaded beside torch, its `ostream << 42` wrote {facts.formatted!r} "
                              f"instead of {PROBE_EXPECTED!r}")
    return facts


def command_builder(cxx: Sequence[str], cflags: Sequence[str] = (), ldflags: Sequence[str] = ()):
    """A probe builder that compiles and links with one command: `cxx cflags -shared ... ldflags`."""
    def build(src: str, out_dir: str) -> str:
        out = os.path.join(out_dir, "probe.so")
        cmd = [*cxx, *cflags, "-shared", "-fPIC", src, "-o", out, *ldflags]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise ToolchainError(f"fastpar: the toolchain probe failed to build: {shlex.join(cmd)}\n{r.stderr}")
        return out
    return build


def ccompiler_builder(ccompiler, cflags: Sequence[str]):
    """A probe builder that does what torch's BuildExtension does for fastpar:
    compile with torch's C++ compiler ($CXX, else c++) and the setuptools
    compiler's flags ($CFLAGS), link with the setuptools compiler's C++ linker
    ($CXX or Python's CXX, plus $LDFLAGS/$LDSHARED)."""
    from torch.utils.cpp_extension import get_cxx_compiler

    def build(src: str, out_dir: str) -> str:
        obj = os.path.join(out_dir, "probe.o")
        cmd = [*shlex.split(get_cxx_compiler()), *ccompiler.compiler_so[1:], *cflags, "-c", src, "-o", obj]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise ToolchainError(f"fastpar: the toolchain probe failed to compile: {shlex.join(cmd)}\n{r.stderr}")
        out = os.path.join(out_dir, "probe.so")
        ccompiler.link_shared_object([obj], out, target_lang="c++")
        return out
    return build


def used_compilers(ccompiler) -> List[str]:
    """[compiler] or [compiler, linker]: torch compiles with $CXX (else c++),
    setuptools links with its C++ compiler ($CXX, else Python's CXX)."""
    from torch.utils.cpp_extension import get_cxx_compiler

    out = [shlex.split(get_cxx_compiler())[0]]
    link = ccompiler.compiler_cxx[0] if getattr(ccompiler, "compiler_cxx", None) else out[0]
    return out if link == out[0] else out + [link]


def describe(compilers: Sequence[str]) -> str:
    def real(c):
        return os.path.realpath(shutil.which(c) or c)

    def where(c):
        return c if real(c) == c else f"{c} ({real(c)})"
    if len(compilers) == 1:
        return where(compilers[0])
    if real(compilers[0]) == real(compilers[1]):
        return f"{compilers[0]} / {compilers[1]} ({real(compilers[0])})"
    return f"{where(compilers[0])} (compiling) and {where(compilers[1])} (linking)"


def static_flags(env: Dict[str, str]) -> List[str]:
    """'LDFLAGS has -static-libstdc++' for each word in the build's environment
    that links the C++ runtime statically."""
    out = []
    for var in FLAG_VARIABLES:
        for word in shlex.split(env.get(var, "")):
            if word in ("-static-libstdc++", "-static") or word.startswith("-Wl,-Bstatic") or \
                    word.endswith("libstdc++.a"):
                out.append(f"{var} has {word}")
    return out


def compiler_sibling(cxx: str) -> Optional[str]:
    """The C compiler beside a C++ one (g++ -> gcc, c++ -> cc, clang++ -> clang): nvcc's host compiler."""
    for tail, c_tail in (("clang++", "clang"), ("g++", "gcc"), ("c++", "cc")):
        if cxx.endswith(tail):
            c = cxx[: -len(tail)] + c_tail
            return c if shutil.which(c) else None
    return None


def compatible_compilers(runtime: Dict[str, object], exclude: Sequence[str] = ()) -> List[str]:
    """C++ compilers on this machine whose probe passes (for the fix in a refusal message)."""
    seen = {os.path.realpath(shutil.which(c) or c) for c in exclude}
    found = []
    for cand in ("/usr/bin/g++", "/usr/bin/c++", shutil.which("g++"), shutil.which("c++"), "/usr/bin/clang++"):
        if not cand or not shutil.which(cand) or os.path.realpath(shutil.which(cand)) in seen:
            continue
        seen.add(os.path.realpath(shutil.which(cand)))
        with tempfile.TemporaryDirectory(prefix="fastpar-probe-") as d:
            try:
                if not probe(command_builder([cand], [abi_define(runtime)]), runtime, d).problems:
                    found.append(cand)
            except ToolchainError:
                continue
    return found


def fix_hint(env: Dict[str, str], compilers: Sequence[str] = (), runtime: Optional[Dict[str, object]] = None) -> str:
    flags = static_flags(env)
    if flags:
        return ("  Cause: " + "; ".join(flags) + ".\n  Fix: build without it (torch needs the shared "
                "libstdc++.so.6): e.g. `env -u LDFLAGS ...` or drop the flag from that variable.")
    if compilers and runtime is not None:
        good = compatible_compilers(runtime, exclude=compilers)
        if good:
            cc = compiler_sibling(good[0])
            pair = f"CXX={good[0]}" + (f" CC={cc}" if cc else "")
            return (f"  Cause: {describe(compilers)} itself links libstdc++ this way (no flag in "
                    f"{', '.join(FLAG_VARIABLES)} asks for it).\n"
                    f"  Fix: build with another compiler, e.g. `{pair} MAX_JOBS=... pip install "
                    f"--no-build-isolation -e .` ({good[0]} was checked here: its probe passes).")
    return ("  Fix: build with a compiler that links libstdc++.so.6 dynamically and uses torch's C++ ABI, "
            "e.g. `CXX=/usr/bin/g++ CC=/usr/bin/gcc`.")


def check_toolchain(build: Callable[[str, str], str], compilers: Sequence[str],
                    runtime: Optional[Dict[str, object]] = None) -> LibraryFacts:
    """Before compiling: raises ToolchainError naming the compiler, the cause and
    the fix when a probe built with `build` does not share torch's runtime."""
    runtime = runtime or torch_runtime()
    with tempfile.TemporaryDirectory(prefix="fastpar-probe-") as d:
        facts = probe(build, runtime, d)
    if facts.problems:
        raise ToolchainError(
            f"fastpar: refusing to build with {describe(compilers)}: a probe library it built does not share torch's "
            "C++ runtime:\n  - " + "\n  - ".join(facts.problems)
            + "\n  fastpar._C built this way would import and then fail at the first `ostream << integer` "
              "(truncated error messages, or a segfault).\n" + fix_hint(os.environ, compilers, runtime))
    return facts
