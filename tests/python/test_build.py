"""What was built: CUDA kernels are compiled whenever the toolkit and a CUDA
build of torch are present (no GPU needed), for every requested architecture."""
import os
import shutil
import subprocess

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
    cuobjdump = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    if not os.path.exists(cuobjdump):
        pytest.skip("cuobjdump not found")
    out = subprocess.run([cuobjdump, "--list-elf", fastpar._C.__file__], capture_output=True, text=True).stdout
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST", "8.0;9.0").replace(" ", ";").split(";")
    for arch in archs:
        sm = "sm_" + arch.replace(".", "").replace("+PTX", "")
        assert sm in out, f"no {sm} code in {fastpar._C.__file__}:\n{out}"


def test_cpu_ops_registered():
    for name in ("allreduce_", "reduce_", "reduce_scatter_", "allgather_", "broadcast_", "copy_many_"):
        assert hasattr(torch.ops.fastpar, name)
