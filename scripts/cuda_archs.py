"""CUDA architectures: what a build asks for (TORCH_CUDA_ARCH_LIST) and what a
built library holds (the entries of its fat binaries), both as nvcc spells
them: "sm_90a" is a cubin for sm_90a, "compute_80" is PTX for compute_80.

TORCH_CUDA_ARCH_LIST entries, separated by ';' or spaces (torch's syntax):
"9.0" -> sm_90, "9.0a" -> sm_90a (arch-specific features, Hopper's wgmma/TMA),
"10.0f" -> sm_100f (family), "8.0+PTX" -> sm_80 and compute_80 PTX. Named
architectures ("Hopper") and "native" are torch's to expand:
`expected_entries` then asks torch for the nvcc flags it would pass.
"""
from __future__ import annotations

import re
import struct
from typing import List, Set

ENTRY = re.compile(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$")
FATBIN_MAGIC = b"\x50\xed\x55\xba"  # 0xBA55ED50, little-endian
FATBIN_KIND_PTX, FATBIN_KIND_CUBIN = 1, 2
# Bits of an entry's 64-bit flags word (offset 40) that carry the arch suffix;
# read off nvcc 13.0's output for sm_90 / sm_90a / sm_100f.
FATBIN_FLAG_SUFFIX = {0x100000: "a", 0x200000: "f"}


def split_arch_list(text: str) -> List[str]:
    """Entries of a TORCH_CUDA_ARCH_LIST, without empty ones ("9.0a; 10.0;" -> ["9.0a", "10.0"])."""
    return [e for e in re.split(r"[;\s]+", text.strip()) if e]


def normalize_arch_list(text: str) -> str:
    """The same list as torch reads it best: ';'-separated, no empty entries
    (torch rejects "9.0;" and "9.0; 10.0" as "Unknown CUDA arch ()")."""
    return ";".join(split_arch_list(text))


def parse_entry(entry: str) -> List[str]:
    """One numeric entry -> the fatbin entries nvcc makes for it."""
    m = ENTRY.match(entry)
    if not m:
        raise ValueError(f"TORCH_CUDA_ARCH_LIST entry {entry!r} is not of the form 9.0, 9.0a, 10.0f or 8.0+PTX")
    arch = f"{m.group(1)}{m.group(2)}{m.group(3)}"
    return [f"sm_{arch}"] + ([f"compute_{arch}"] if m.group(4) else [])


def parse_gencode_flags(flags: List[str]) -> Set[str]:
    """`-gencode=arch=compute_90a,code=sm_90a` flags (torch's output) -> {"sm_90a"}."""
    out = set()
    for f in flags:
        m = re.search(r",code=\[?([\w,]+)\]?", f)
        if m:
            out.update(c for c in m.group(1).split(",") if c.startswith(("sm_", "compute_")))
    return out


def expected_entries(text: str) -> Set[str]:
    """Fatbin entries a build with this TORCH_CUDA_ARCH_LIST must contain."""
    entries = split_arch_list(text)
    if all(ENTRY.match(e) for e in entries):
        return {x for e in entries for x in parse_entry(e)}
    import os

    from torch.utils.cpp_extension import _get_cuda_arch_flags  # named arches, "native"

    old = os.environ.get("TORCH_CUDA_ARCH_LIST")
    os.environ["TORCH_CUDA_ARCH_LIST"] = normalize_arch_list(text)
    try:
        return parse_gencode_flags(_get_cuda_arch_flags())
    finally:
        if old is None:
            del os.environ["TORCH_CUDA_ARCH_LIST"]
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = old


def gencode_flags(text: str) -> List[str]:
    """nvcc's -gencode flags for a TORCH_CUDA_ARCH_LIST: one PTX for every plain arch.

    The plain entries (no 'a'/'f' suffix) share the PTX of the lowest of them:
    "8.0;9.0" -> `arch=compute_80,code=[sm_80,sm_90]`, so NVVM, the larger half
    of a kernel file's compile, runs once instead of once per arch. fastpar's
    kernels use no feature above the lowest arch they are built for (their only
    arch test is `defined(__CUDA_ARCH__)`), and ptxas makes the same sm_90 code
    from either PTX (docs/measurements.md). A suffixed entry uses features of its
    own arch and gets its own PTX; "+PTX" embeds that entry's PTX as well.
    Named arches and "native" return [] and are torch's to expand."""
    matches = [ENTRY.match(e) for e in split_arch_list(text)]
    if not matches or not all(matches):
        return []
    parsed = [m.groups() for m in matches]
    plain = sorted({(int(ma), int(mi)) for ma, mi, suffix, _ in parsed if not suffix})
    flags = []
    if plain:
        cubins = ",".join(f"sm_{ma}{mi}" for ma, mi in plain)
        code = f"[{cubins}]" if len(plain) > 1 else cubins
        flags.append(f"-gencode=arch=compute_{plain[0][0]}{plain[0][1]},code={code}")
    for ma, mi, suffix, ptx in parsed:
        arch = f"{ma}{mi}{suffix}"
        if suffix:
            flags.append(f"-gencode=arch=compute_{arch},code=sm_{arch}")
        if ptx:
            flags.append(f"-gencode=arch=compute_{arch},code=compute_{arch}")
    return list(dict.fromkeys(flags))


def fatbin_entries(data: bytes) -> Set[str]:
    """Entries of every fat binary embedded in `data` (a shared object's bytes).

    No cuobjdump on our machines, so walk the format directly: a fatbin is a
    16-byte header (magic, version, header size, payload size) followed by
    entries whose header holds the kind (1 = PTX, 2 = cubin) at offset 0, its
    own header size at 4, the payload size at 8, the SM number at 28 and flags
    at 40 (the 'a'/'f' suffix bits)."""
    found, pos = set(), data.find(FATBIN_MAGIC)
    while pos != -1:
        _, _, hsize, fsize = struct.unpack_from("<IHHQ", data, pos)
        entry, end = pos + hsize, min(pos + hsize + fsize, len(data))
        while hsize == 16 and entry + 48 <= end:
            kind, ehsize, esize = struct.unpack_from("<HxxIQ", data, entry)
            sm, = struct.unpack_from("<I", data, entry + 28)
            flags, = struct.unpack_from("<Q", data, entry + 40)
            suffix = "".join(s for bit, s in FATBIN_FLAG_SUFFIX.items() if flags & bit)
            if kind in (FATBIN_KIND_PTX, FATBIN_KIND_CUBIN):
                found.add(f"{'sm' if kind == FATBIN_KIND_CUBIN else 'compute'}_{sm}{suffix}")
            if ehsize == 0:
                break
            entry += ehsize + esize
        pos = data.find(FATBIN_MAGIC, pos + 4)
    return found


def library_entries(path: str) -> Set[str]:
    with open(path, "rb") as f:
        return fatbin_entries(f.read())
