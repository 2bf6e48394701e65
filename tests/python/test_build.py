"""What was built: CUDA kernels are compiled whenever the toolkit and a CUDA
build of torch are present (no GPU needed), for every requested architecture."""
import os
import shutil
import struct

import pytest
import torch

import fastpar


def _toolkit_present():
    return torch.version.cuda is not None and shutil.which("nvcc") is not None


def test_build_info_is_consistent():
    info = fastpar.build_info()
    assert info["cuda_built"] == fastpar.cuda_built() == bool(fastpar._C.built_with_cuda)
    assert info["torch"] == torch.__version__


@pytest.mark.skipif(not _toolkit_present(), reason="needs nvcc and a CUDA build of torch")
@pytest.mark.skipif(os.environ.get("FASTPAR_CUDA") == "0", reason="CUDA build disabled by FASTPAR_CUDA=0")
def test_cuda_kernels_compiled_for_sm80_and_sm90():
    assert fastpar.cuda_built(), "nvcc and a CUDA torch are present but the CUDA sources were not built"
    archs = {a.strip().replace(".", "").replace("+PTX", "")
             for a in os.environ.get("TORCH_CUDA_ARCH_LIST", "8.0;9.0").replace(" ", ";").split(";") if a.strip()}
    found = fatbin_cubin_archs(fastpar._C.__file__)
    for arch in sorted(archs):
        assert int(arch) in found, f"no sm_{arch} cubin in {fastpar._C.__file__} (found {sorted(found)})"


def fatbin_cubin_archs(path):
    """SM versions of the cubins embedded in a shared object's fat binaries.

    No cuobjdump on our machines, so walk the format directly: a fatbin is a
    16-byte header (magic 0xBA55ED50, version, header size, payload size)
    followed by entries whose header holds kind (2 = cubin, 1 = PTX) at offset 0,
    its own header size at 4, payload size at 8 and the SM version at 28."""
    data = open(path, "rb").read()
    archs, pos = set(), data.find(b"\x50\xed\x55\xba")
    while pos != -1:
        _, _, hsize, fsize = struct.unpack_from("<IHHQ", data, pos)
        entry, end = pos + hsize, pos + hsize + fsize
        while hsize == 16 and entry + 32 <= min(end, len(data)):
            kind, ehsize, esize = struct.unpack_from("<HxxIQ", data, entry)
            arch = struct.unpack_from("<I", data, entry + 28)[0]
            if kind == 2:
                archs.add(arch)
            if ehsize == 0:
                break
            entry += ehsize + esize
        pos = data.find(b"\x50\xed\x55\xba", pos + 4)
    return archs
