"""fastpar: the collective core for data-parallel PyTorch training.

Single process, one tensor per device (CPU tensors welcome)::

    import fastpar
    fastpar.allreduce(tensors)            # in place, torch.distributed.ReduceOp.SUM

One process per device: ``dist.init_process_group("fastpar")`` (registered on
import), then stock torch.distributed / DDP, or fastpar.DistributedDataParallel.
One process, several devices: fastpar.DataParallel.
"""
import os as _os

import torch  # noqa: F401  (loads libtorch before the extension)

from . import _build_check

# A build for another torch (version or C++ ABI) fails here with the versions
# and the command that rebuilds it, not with an undefined symbol.
_build_check.check(_os.path.dirname(_os.path.abspath(__file__)))
try:
    from . import _C  # noqa: F401  registers torch.ops.fastpar.*
except ImportError as _e:
    _err = _build_check.explain(_e, _os.path.dirname(_os.path.abspath(__file__)))
    if _err is _e:
        raise
    raise _err from _e
from .comm import (  # noqa: F401
    all_gather,
    all_reduce,
    allgather,
    allreduce,
    allreduce_coalesced,
    broadcast,
    broadcast_coalesced,
    gather,
    reduce,
    reduce_add,
    reduce_add_coalesced,
    reduce_scatter,
    scatter,
)
from . import distributed  # noqa: F401  registers the torch.distributed backend "fastpar"
from .data_parallel import DataParallel  # noqa: F401
from .ddp import DistributedDataParallel  # noqa: F401
from .ddp_comm_hook import comm_hook  # noqa: F401

__version__ = "0.1.0"


def cuda_built() -> bool:
    """True when the CUDA kernels were compiled into this build (a GPU is not needed for that)."""
    return bool(_C.built_with_cuda)


def build_info() -> dict:
    """fastpar's version, the torch it runs with, whether CUDA was built, and
    built_for: the torch version and C++ ABI setup.py recorded at the build
    (None without a record: an extension copied in without its
    fastpar/_build_info.py)."""
    return {"version": __version__, "torch": torch.__version__, "cuda_built": cuda_built(),
            "torch_cuda": torch.version.cuda,
            "built_for": _build_check.read_record(_os.path.dirname(_os.path.abspath(__file__)))}

