"""What every scenario shares: this rank's coordinates (from dist_worker.py's
command line), its device (from the environment), joining a process group,
and the checks. The test modules that hold scenarios import their names from
here; in the pytest process, which imports those modules but runs no
scenario, the coordinates are None.

FASTPAR_TEST_DEVICE picks the tensors' device: "cpu" (the default) or "cuda".
On cuda, FASTPAR_TEST_GPU_LAYOUT picks the GPUs: "distinct" (the default:
rank r uses cuda:r, needs >= WORLD GPUs) or "shared" (every rank on cuda:0:
one GPU is enough; NCCL cannot run there, so every CUDA collective must go
over CUDA IPC or be refused by name)."""
from __future__ import annotations

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import fastpar  # registers the "fastpar" backend
import fastpar.distributed as fd
from reference import OPS

IN_WORKER = os.path.basename(sys.argv[0]) == "dist_worker.py"
if IN_WORKER:
    SCENARIO, RANK, WORLD, PORT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
else:
    SCENARIO = RANK = WORLD = PORT = None
# A list changed in place (a batch sets each scenario's), so that names
# imported from here stay current.
ARGS: list[str] = sys.argv[5:] if IN_WORKER else []
STORE_PREFIX = ""  # a batch gives each scenario its own keys of the launch's TCPStore
_BASE_STORE = None
# The CPU scenarios' group timeout (read once); CUDA ones read theirs at each init.
TIMEOUT_S = float(os.environ.get("FASTPAR_TEST_TIMEOUT_S", "10"))

DEVICE_TYPE = os.environ.get("FASTPAR_TEST_DEVICE", "cpu")
assert DEVICE_TYPE in ("cpu", "cuda"), DEVICE_TYPE
CUDA = DEVICE_TYPE == "cuda"
LAYOUT = os.environ.get("FASTPAR_TEST_GPU_LAYOUT", "distinct")
assert LAYOUT in ("distinct", "shared"), LAYOUT
SHARED = LAYOUT == "shared"
DEV = torch.device("cuda", 0 if SHARED else RANK) if CUDA and IN_WORKER else torch.device("cpu")
MAX_IPC = int(os.environ.get("FASTPAR_CUDA_IPC_MAX_BYTES", 8 << 20))


def group_timeout_s() -> float:
    """A CUDA scenario's group timeout (read at each init: a batch sets it per scenario)."""
    return float(os.environ.get("FASTPAR_TEST_TIMEOUT_S", "60"))


def base_store():
    """The launch's TCPStore (rank 0 serves it on PORT), made once per process."""
    global _BASE_STORE
    if _BASE_STORE is None:
        _BASE_STORE = dist.TCPStore("127.0.0.1", PORT, WORLD, RANK == 0,
                                    timeout=datetime.timedelta(seconds=60 if CUDA else 30), wait_for_workers=False)
    return _BASE_STORE


def set_scenario(args, prefix: str) -> None:
    """A batch's next scenario: its ARGS and its keys of the store."""
    global STORE_PREFIX
    ARGS[:] = [str(a) for a in args]
    STORE_PREFIX = prefix


def init(timeout_s: float | None = None, backend: str | None = None, device_id=None):
    """Joins this scenario's process group: "fastpar" for CPU tensors,
    "cpu:fastpar,cuda:fastpar" on this rank's GPU for CUDA ones."""
    if CUDA:
        torch.cuda.set_device(DEV)
    store = base_store()
    if STORE_PREFIX:
        store = dist.PrefixStore(STORE_PREFIX, store)
    backend = backend or ("cpu:fastpar,cuda:fastpar" if CUDA else "fastpar")
    timeout_s = timeout_s or (group_timeout_s() if CUDA else TIMEOUT_S)
    dist.init_process_group(backend, store=store, rank=RANK, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=timeout_s), device_id=device_id)
    return store


def finish():
    dist.destroy_process_group()


def error_exit(t0: float, e: Exception):
    """Exits 3 with the error and how long after t0 it came on stderr (the
    fault tests check both)."""
    print(f"ERROR after {time.monotonic() - t0:.1f}s: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    sys.exit(3)


def cuda_backend(group=None):
    b = fd.get_fastpar_backend(group).cuda_engine
    assert isinstance(b, fastpar._C.CudaEngine), type(b)
    return b


def peer_access_everywhere() -> bool:
    """Whether the group gets CUDA IPC: ranks on one GPU always do, ranks on
    several GPUs where every pair has peer access."""
    if SHARED:
        return True
    return all(torch.cuda.can_device_access_peer(a, b) for a in range(WORLD) for b in range(WORLD) if a != b)


def ops_for(dtype):
    return OPS


def check(got: torch.Tensor, want: torch.Tensor, what: str, exact: bool = True):
    """`exact=False` allows float rounding; integer results are always exact."""
    if exact or not got.is_floating_point():
        assert torch.equal(got, want), f"{what}: got {got[:8]} want {want[:8]}"
    else:
        torch.testing.assert_close(got, want, msg=lambda m: f"{what}: {m}")


def check_equal(got: torch.Tensor, want: torch.Tensor, what: str, exact: bool):
    """check() for a result on any device against a CPU reference, with the
    CUDA tests' tolerance where NCCL's summation order is its own."""
    if exact:
        assert torch.equal(got.cpu(), want), f"{what}: got {got.flatten()[:6]} want {want.flatten()[:6]}"
    else:
        torch.testing.assert_close(got.cpu(), want, rtol=2e-2, atol=1e-2, msg=lambda m: f"{what}: {m}")


def same_bits_everywhere(t: torch.Tensor, what: str):
    """Every rank holds the same bits (on CUDA the gather itself is over CUDA
    IPC, NCCL above the threshold on distinct GPUs)."""
    b = t.contiguous().view(torch.uint8).flatten() if t.numel() else torch.zeros(0, dtype=torch.uint8)
    gathered = [torch.empty_like(b) for _ in range(WORLD)]
    dist.all_gather(gathered, b)
    for q in range(WORLD):
        assert torch.equal(gathered[q], b), f"{what}: rank {q} has different bits than rank {RANK}"
