"""What was built: CUDA kernels are compiled whenever the toolkit and a CUDA
build of torch are present (no GPU needed), for every requested architecture,
suffixed ones included (TORCH_CUDA_ARCH_LIST="9.0a;10.0", "8.0+PTX"), the plain
ones from one PTX."""
import os
import re
import shutil
import struct
import subprocess
import sys

import pytest
import torch

import fastpar

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "scripts"))
import cuda_archs  # noqa: E402
import elf_info  # noqa: E402

ARCH_LIST = os.environ.get("TORCH_CUDA_ARCH_LIST", "") or "8.0;9.0"  # setup.py's default


def _toolkit_present():
    return torch.version.cuda is not None and shutil.which("nvcc") is not None


def test_build_info_is_consistent():
    info = fastpar.build_info()
    assert info["cuda_built"] == fastpar.cuda_built() == bool(fastpar._C.built_with_cuda)
    assert info["torch"] == torch.__version__


@pytest.mark.skipif(not _toolkit_present(), reason="needs nvcc and a CUDA build of torch")
@pytest.mark.skipif(os.environ.get("FASTPAR_CUDA") == "0", reason="CUDA build disabled by FASTPAR_CUDA=0")
def test_cuda_kernels_compiled_for_every_requested_arch():
    assert fastpar.cuda_built(), "nvcc and a CUDA torch are present but the CUDA sources were not built"
    expected = cuda_archs.expected_entries(ARCH_LIST)
    found = cuda_archs.library_entries(fastpar._C.__file__)
    missing = sorted(expected - found)
    assert not missing, (f"TORCH_CUDA_ARCH_LIST={ARCH_LIST!r} asks for {sorted(expected)}; "
                         f"{fastpar._C.__file__} lacks {missing} (holds {sorted(found)})")


@pytest.mark.parametrize("text, entries", [
    ("9.0", {"sm_90"}),
    ("9.0a", {"sm_90a"}),
    ("8.0+PTX", {"sm_80", "compute_80"}),
    ("9.0a;10.0", {"sm_90a", "sm_100"}),
    ("8.0 9.0a+PTX", {"sm_80", "sm_90a", "compute_90a"}),
    ("10.0f; 12.0a;", {"sm_100f", "sm_120a"}),
])
def test_arch_list_entries_with_suffixes(text, entries):
    assert cuda_archs.expected_entries(text) == entries


def test_arch_list_is_normalized_for_torch():
    assert cuda_archs.normalize_arch_list(" 9.0a; 10.0;") == "9.0a;10.0"
    assert cuda_archs.normalize_arch_list("8.0 8.6+PTX") == "8.0;8.6+PTX"
    with pytest.raises(ValueError, match=r"entry '9\.0b' is not of the form"):
        cuda_archs.parse_entry("9.0b")


def test_our_parser_agrees_with_the_flags_torch_passes_to_nvcc(monkeypatch):
    """A list builds the fatbin entries torch's own flags would: our parser,
    which setup.py's gencode flags follow, agrees with torch on every list."""
    from torch.utils.cpp_extension import _get_cuda_arch_flags

    for text in ("9.0a;10.0", "8.0+PTX", "9.0;9.0a+PTX", "8.0 8.6"):
        monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", cuda_archs.normalize_arch_list(text))
        assert cuda_archs.parse_gencode_flags(_get_cuda_arch_flags()) == cuda_archs.expected_entries(text), text


@pytest.mark.parametrize("text, flags", [
    ("8.0;9.0", ["-gencode=arch=compute_80,code=[sm_80,sm_90]"]),
    ("9.0", ["-gencode=arch=compute_90,code=sm_90"]),
    ("9.0 8.0+PTX;9.0", ["-gencode=arch=compute_80,code=[sm_80,sm_90]", "-gencode=arch=compute_80,code=compute_80"]),
    ("8.0;9.0a+PTX", ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90a,code=sm_90a",
                      "-gencode=arch=compute_90a,code=compute_90a"]),
    ("10.0f;12.0a", ["-gencode=arch=compute_100f,code=sm_100f", "-gencode=arch=compute_120a,code=sm_120a"]),
    ("Hopper", []),
])
def test_plain_archs_share_the_lowest_ones_ptx(text, flags):
    """setup.py's nvcc flags: NVVM runs once for every plain arch; what they
    build is still exactly the list's entries."""
    assert cuda_archs.gencode_flags(text) == flags
    if flags:
        assert cuda_archs.parse_gencode_flags(flags) == cuda_archs.expected_entries(text)


def test_named_arches_are_expanded_by_torch():
    assert cuda_archs.expected_entries("Hopper") == {"sm_90", "compute_90"}


def _fatbin(entries):
    """A synthetic fat binary: (kind, sm, flags) per entry, 64-byte entry headers."""
    body = b""
    for kind, sm, flags in entries:
        payload = b"\0" * 16
        hdr = struct.pack("<HHIQ", kind, 0x101, 64, len(payload)) + b"\0" * 12 + struct.pack("<I", sm)
        hdr += b"\0" * 8 + struct.pack("<Q", flags)
        body += hdr.ljust(64, b"\0") + payload
    return b"junk" + struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body + b"tail"


def test_fatbin_reader_on_synthetic_entries():
    data = _fatbin([(2, 90, 0x100011), (2, 80, 0x11), (1, 80, 0x8011), (2, 100, 0x1200011)])
    assert cuda_archs.fatbin_entries(data) == {"sm_90a", "sm_80", "compute_80", "sm_100f"}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_fatbin_reader_on_what_nvcc_builds(tmp_path):
    """Pins the suffix flag bits against the real compiler's output."""
    src = tmp_path / "k.cu"
    src.write_text("__global__ void k(float* x) { x[threadIdx.x] += 1.f; }\n")
    out = tmp_path / "k.o"
    gencode = ["-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_80,code=sm_80",
               "-gencode=arch=compute_80,code=compute_80"]
    subprocess.run(["nvcc", "-c", *gencode, str(src), "-o", str(out)], check=True, capture_output=True)
    assert cuda_archs.library_entries(str(out)) == {"sm_90a", "sm_80", "compute_80"}
    text = "8.0;9.0;9.0a+PTX"
    subprocess.run(["nvcc", "-c", *cuda_archs.gencode_flags(text), str(src), "-o", str(out)], check=True,
                   capture_output=True)
    assert cuda_archs.library_entries(str(out)) == cuda_archs.expected_entries(text)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the ELF file")
def test_release_build_has_no_debug_info():
    """setup.py ends the C++ and nvcc host lines with -g0 (Python's sysconfig
    CFLAGS put -g first): the extension carries no DWARF, unless built with
    FASTPAR_DEBUG_INFO=1 (then it must: the opt-in works). The sizes, for the
    failure message: debug info once made it 94 MiB for one architecture."""
    sections = elf_info.section_sizes(fastpar._C.__file__)
    assert ".text" in sections, sorted(sections)
    debug = {k: v for k, v in sections.items() if k.startswith(".debug_")}
    if os.environ.get("FASTPAR_DEBUG_INFO") == "1":
        assert ".debug_info" in debug, f"FASTPAR_DEBUG_INFO=1 but {fastpar._C.__file__} has no .debug_info"
    else:
        assert not debug, (f"{fastpar._C.__file__} ({os.path.getsize(fastpar._C.__file__)} bytes) carries debug "
                           f"sections {debug}; release builds end their compile lines with -g0")


def test_elf_section_names_are_read():
    import sysconfig

    lib = os.path.join(sysconfig.get_config_var("LIBDIR") or "", sysconfig.get_config_var("LDLIBRARY") or "")
    path = lib if os.path.exists(lib) and lib.endswith(".so") else sys.executable
    names = elf_info.section_sizes(os.path.realpath(path))
    assert ".text" in names and ".dynsym" in names and all(v >= 0 for v in names.values()), sorted(names)


BUILD_LOG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), ".venv",
                         "fastpar-build.log")


@pytest.mark.skipif(not os.path.exists(BUILD_LOG), reason="no scripts/setup.sh build log (.venv/fastpar-build.log)")
def test_fastpar_sources_compile_without_warnings():
    """A warning in our own code has meant a bug: `CUDAGuard guard(c10::DeviceIndex(d));`
    was a function declaration (-Wvexing-parse), so no device guard was active."""
    with open(BUILD_LOG, errors="replace") as f:
        # gcc: ".../csrc/a.cpp:276:29: warning: ...", nvcc: ".../csrc/k.cu(12): warning #177-D: ..."
        ours = [line.strip() for line in f if re.search(r"(^|/)csrc/\S+(:\d+:\d+:|\(\d+\):) warning", line)]
    assert not ours, "compiler warnings in csrc/:\n" + "\n".join(ours[:20])
