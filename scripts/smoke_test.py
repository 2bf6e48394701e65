"""Right after a build: fastpar._C shares torch's C++ runtime, and its
error-message path (the first `ostream << integer`, where an extension with a
private static libstdc++ truncates the message or segfaults) gives the whole
message. Run as a separate process so that a crash is an exit code:

    python scripts/smoke_test.py
"""
import os
import sys

import torch

import fastpar

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import toolchain_guard  # noqa: E402

EXPECTED = ("tensors[1] has 4 elements (shape [4])", "tensors[0] has 3 elements (shape [3])")


def bad_allreduce_message(device: str) -> str:
    try:
        fastpar.allreduce([torch.zeros(3, device=device), torch.zeros(4, device=device)])
    except ValueError as e:
        return str(e)
    raise AssertionError(f"fastpar.allreduce accepted tensors of 3 and 4 elements on {device}")


def main() -> None:
    try:
        toolchain_guard.check_library(fastpar._C.__file__)
    except toolchain_guard.ToolchainError as e:
        sys.exit(f"fastpar smoke test FAILED: {e}")
    devices = ["cpu"] + (["cuda:0"] if fastpar.cuda_built() and torch.cuda.is_available() else [])
    for device in devices:
        msg = bad_allreduce_message(device)
        if not all(part in msg for part in EXPECTED):
            sys.exit(f"fastpar smoke test FAILED on {device}: the error message is {msg!r}, expected it to contain "
                     f"{' and '.join(map(repr, EXPECTED))}; the extension's iostreams are broken (see "
                     "scripts/toolchain_guard.py)")
    print(f"fastpar smoke test passed ({fastpar._C.__file__}; error messages whole on {', '.join(devices)})")


if __name__ == "__main__":
    main()
