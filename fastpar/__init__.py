"""fastpar: collectives for data-parallel PyTorch training."""
import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C  # noqa: F401  registers torch.ops.fastpar.*
from . import distributed  # noqa: F401  registers the torch.distributed backend "fastpar"
