"""One rank for test_init_crash.py / test_fork.py: joins a 2-rank fastpar group
on a TCPStore (served by the test, as torchrun's agent serves one, or by rank 0
with --rank0-store), all_reduces 20 times checking each result, and exits 0; a DistBackendError prints its
message after "DistBackendError: " and exits 3.

usage: init_crash_worker.py RANK WORLD PORT TIMEOUT_S [--rank0-store] [--fork MODE]
--fork MODE: after init, fork a child that calls destroy_process_group() on its
inherited group and exits (MODE "exit": sys.exit; "_exit": os._exit after the
destroy; "collective": the child first calls all_reduce, which must raise
DistBackendError naming the fork), before the parent's all_reduces."""
import datetime
import os
import signal
import sys

import torch
import torch.distributed as dist

import fastpar  # noqa: F401  registers the backend

# SIGINT raises KeyboardInterrupt, as in any Python program, even where the
# shell that started pytest ignored it (a background job without job
# control), an ignore every child inherits.
signal.signal(signal.SIGINT, signal.default_int_handler)


def main():
    rank, world, port, timeout_s = (int(a) for a in sys.argv[1:5])
    rank0_store = "--rank0-store" in sys.argv
    fork_mode = sys.argv[sys.argv.index("--fork") + 1] if "--fork" in sys.argv else None
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        if rank0_store:
            dist.init_process_group("fastpar", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                    timeout=timeout)
        else:
            store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
            dist.init_process_group("fastpar", store=store, rank=rank, world_size=world, timeout=timeout)
        if fork_mode:
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    if fork_mode == "collective":
                        try:
                            dist.all_reduce(torch.ones(4))
                            code = 6
                        except dist.DistBackendError as e:
                            code = 0 if "is a forked child of the rank that created the group" in str(e) else 7
                            print(f"child: {e}", flush=True)
                    dist.destroy_process_group()
                except BaseException as e:  # noqa: BLE001  reported through the exit code
                    print(f"child: {type(e).__name__}: {e}", flush=True)
                    code = 5
                if fork_mode == "_exit":
                    os._exit(code)
                sys.exit(code)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0, status
        for i in range(20):
            t = torch.full((1000,), float(rank + 1 + i))
            dist.all_reduce(t)
            want = sum(r + 1 + i for r in range(world))
            assert torch.equal(t, torch.full((1000,), float(want))), (i, t[:4])
        dist.barrier()
        dist.destroy_process_group()
        print("OK", flush=True)
    except dist.DistBackendError as e:
        print(f"DistBackendError: {e}", flush=True)
        sys.exit(3)


if __name__ == "__main__":
    main()
