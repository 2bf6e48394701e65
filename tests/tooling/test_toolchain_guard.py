"""The build guard (scripts/toolchain_guard.py): a toolchain that links
libstdc++ statically, or compiles for another C++ ABI than torch's, is refused
before anything is compiled, with the cause and the fix; a linked library that
does not share torch's runtime is refused after linking. Checked on tiny probe
libraries (a second full build of fastpar would cost minutes), and end to end
through setup.py, which stops within seconds."""
import os
import shutil
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import elf_info  # noqa: E402
import toolchain_guard as guard  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

FLAG_VARS = guard.FLAG_VARIABLES


@pytest.fixture(scope="module")
def runtime():
    return guard.torch_runtime()


@pytest.fixture
def clean_env(monkeypatch):
    """No compiler or flag variables from the caller's environment."""
    for var in FLAG_VARS + ("LDCXXSHARED",):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def setuptools_compiler():
    """The compiler object setup.py's build_ext gets, from the current environment."""
    import setuptools  # noqa: F401  (provides distutils)
    from distutils.ccompiler import new_compiler
    from distutils.sysconfig import customize_compiler

    c = new_compiler()
    customize_compiler(c)
    return c


def build_probe(tmp_path, *ldflags):
    src = tmp_path / "probe.cpp"
    src.write_text(guard.PROBE_SOURCE)
    return guard.command_builder(["g++"], ldflags=ldflags)(str(src), str(tmp_path))


def test_elf_reader_tells_a_shared_from_a_static_libstdcxx(tmp_path, runtime):
    (tmp_path / "dyn").mkdir()
    (tmp_path / "static").mkdir()
    dyn = build_probe(tmp_path / "dyn")
    static = build_probe(tmp_path / "static", "-static-libstdc++")
    assert "libstdc++.so.6" in elf_info.needed(dyn)
    assert "libstdc++.so.6" not in elf_info.needed(static)
    assert "fastpar_probe_format" in elf_info.defined_symbols(dyn)
    assert any(s.startswith("_ZNSo") for s in elf_info.defined_symbols(static))
    assert not any(s.startswith("_ZNSo") for s in elf_info.defined_symbols(dyn))
    assert runtime["library"] == "libstdc++.so.6", "torch's libc10.so should need the shared libstdc++"


def test_static_probe_really_breaks_ostream_beside_torch(tmp_path):
    """The fault itself, without fastpar: a statically linked libstdc++ loaded
    into a process that has torch's libstdc++.so.6 loses number formatting."""
    (tmp_path / "dyn").mkdir()
    (tmp_path / "static").mkdir()
    assert guard.run_probe(build_probe(tmp_path / "dyn")) == guard.PROBE_EXPECTED
    assert guard.run_probe(build_probe(tmp_path / "static", "-static-libstdc++")) != guard.PROBE_EXPECTED


def test_check_library_refuses_a_statically_linked_library(tmp_path, runtime):
    static = build_probe(tmp_path, "-static-libstdc++")
    with pytest.raises(guard.ToolchainError) as e:
        guard.check_library(static, runtime)
    msg = str(e.value)
    assert f"it does not depend on libstdc++.so.6 (it needs {', '.join(elf_info.needed(static))})" in msg
    assert "of libstdc++'s own symbols (e.g. _ZN" in msg


def test_check_library_accepts_the_built_extension(runtime):
    import fastpar

    guard.check_library(fastpar._C.__file__, runtime)  # raises if the build under test is broken
    assert runtime["library"] in elf_info.needed(fastpar._C.__file__)


def test_static_libstdcxx_in_ldflags_is_refused_naming_the_flag(clean_env, runtime):
    clean_env.setenv("LDFLAGS", "-static-libstdc++")
    c = setuptools_compiler()
    with pytest.raises(guard.ToolchainError) as e:
        guard.check_toolchain(guard.ccompiler_builder(c, [guard.abi_define(runtime)]), guard.used_compilers(c),
                              runtime)
    msg = str(e.value)
    assert msg.startswith(f"fastpar: refusing to build with {guard.describe(guard.used_compilers(c))}: ")
    assert "does not depend on libstdc++.so.6" in msg
    assert f"instead of {guard.PROBE_EXPECTED!r}" in msg
    assert "Cause: LDFLAGS has -static-libstdc++." in msg


def test_compiler_that_links_statically_by_default_is_refused_with_a_checked_fix(tmp_path, clean_env, runtime):
    """A stand-in for the GPU machine's /opt/gcc/bin/g++: a g++ that always adds -static-libstdc++."""
    fake = tmp_path / "g++"
    fake.write_text(f'#!/bin/sh\nexec {shutil.which("g++")} "$@" -static-libstdc++\n')
    fake.chmod(0o755)
    clean_env.setenv("CXX", str(fake))
    c = setuptools_compiler()
    compilers = guard.used_compilers(c)
    assert compilers == [str(fake)]
    with pytest.raises(guard.ToolchainError) as e:
        guard.check_toolchain(guard.ccompiler_builder(c, [guard.abi_define(runtime)]), compilers, runtime)
    msg = str(e.value)
    assert msg.startswith(f"fastpar: refusing to build with {fake}: ")
    assert f"Cause: {fake} itself links libstdc++ this way" in msg
    good = guard.compatible_compilers(runtime, exclude=[str(fake)])
    assert good, "the system g++ should pass the probe"
    assert f"Fix: build with another compiler, e.g. `CXX={good[0]}" in msg


def test_clean_toolchain_passes_with_torchs_abi(clean_env, runtime):
    c = setuptools_compiler()
    facts = guard.check_toolchain(guard.ccompiler_builder(c, [guard.abi_define(runtime)]), guard.used_compilers(c),
                                  runtime)
    assert facts.problems == []
    assert facts.abi == runtime["abi"]
    assert facts.formatted == guard.PROBE_EXPECTED


def test_other_abi_in_cflags_is_overridden_by_torchs_and_refused_without_it(clean_env, runtime):
    other = 1 - runtime["abi"]
    clean_env.setenv("CFLAGS", f"-D_GLIBCXX_USE_CXX11_ABI={other}")
    c = setuptools_compiler()
    facts = guard.check_toolchain(guard.ccompiler_builder(c, [guard.abi_define(runtime)]), guard.used_compilers(c),
                                  runtime)
    assert facts.abi == runtime["abi"]  # setup.py's define comes last and wins
    with pytest.raises(guard.ToolchainError) as e:
        guard.check_toolchain(guard.ccompiler_builder(c, []), guard.used_compilers(c), runtime)
    assert (f"it was compiled with _GLIBCXX_USE_CXX11_ABI={other}, but torch uses "
            f"_GLIBCXX_USE_CXX11_ABI={runtime['abi']}") in str(e.value)


def test_static_flags_are_found_in_every_variable_that_reaches_the_link():
    env = {"LDFLAGS": "-O2 -static-libstdc++", "CXX": "g++ -static", "CFLAGS": "-O3",
           "LDSHARED": "gcc -shared -Wl,-Bstatic -lstdc++", "CXXFLAGS": "/opt/lib/libstdc++.a"}
    assert guard.static_flags(env) == ["CXX has -static", "LDSHARED has -Wl,-Bstatic", "LDFLAGS has -static-libstdc++",
                                       "CXXFLAGS has /opt/lib/libstdc++.a"]
    assert guard.static_flags({"LDFLAGS": "-Wl,-O1", "CFLAGS": "-O3 -fPIC"}) == []


def test_setup_py_refuses_static_libstdcxx_before_compiling(tmp_path):
    """End to end: `setup.py build_ext` with LDFLAGS=-static-libstdc++ stops at
    the probe, within seconds, with the fix, and leaves no extension behind."""
    env = {k: v for k, v in os.environ.items() if k not in FLAG_VARS}
    env.update(LDFLAGS="-static-libstdc++", FASTPAR_CUDA="0")
    t0 = time.time()
    r = subprocess.run([sys.executable, "setup.py", "build_ext", "--build-temp", str(tmp_path / "temp"),
                        "--build-lib", str(tmp_path / "lib")], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode != 0, r.stdout[-2000:]
    assert "fastpar: refusing to build with " in r.stderr
    assert "Cause: LDFLAGS has -static-libstdc++." in r.stderr
    assert not list(tmp_path.rglob("*.so")) and not list(tmp_path.rglob("*.o")), "nothing should have been compiled"
    assert time.time() - t0 < 120
