// The words of the CUDA IPC backend's failures and of its GPU-sharing state,
// kept torch-free and CUDA-free so ctest checks them
// (tests/cpp/test_ipc_failure.cpp); the c10d backend wraps them in
// DistBackendError / warnings.
#pragma once

#include <cstdint>
#include <string>

#include "../collective_call.h"  // describe
#include "../flag_protocol.h"

namespace fastpar {
namespace cuda_ipc {

// Human words for a flags::WaitStatus stored in a status word.
inline const char* wait_status_text(uint32_t status) {
  switch (flags::WaitStatus(status)) {
    case flags::WaitStatus::kOk: return "ok";
    case flags::WaitStatus::kTimeout: return "timed out waiting for a peer's flag";
    case flags::WaitStatus::kPeerAborted: return "a peer aborted";
    case flags::WaitStatus::kPeerDead: return "a peer died";
    case flags::WaitStatus::kMismatch:
      return "peers are in a different call (op, numel, dtype, root or algorithm differ; for send/recv: "
             "the sender's next message to this rank has a different tag or size)";
  }
  return "unknown failure";
}

// What the host knows besides the status word.
struct FailureFacts {
  uint32_t status = 0;       // the status word (a flags::WaitStatus), 0 if none recorded yet
  int dead_rank = -1;        // a peer the watcher found dead, or -1
  int64_t dead_pid = -1;
  bool aborted_here = false; // this rank's abort() was called
  // A peer in a different call, as this rank's kernel recorded it: the peer
  // (-1: none recorded) and both descriptors.
  int mismatch_peer = -1;
  flags::OpDesc mine{}, theirs{};
  // The failure a CUDA graph replay of all_reduce found (its status), or 0.
  uint32_t replay_status = 0;
};

// True when the communicator can no longer be used.
inline bool failed(const FailureFacts& f) { return f.status != 0 || f.dead_rank >= 0 || f.aborted_here; }

// "fastpar: <op> over CUDA IPC failed on rank R: <cause> ...". A dead peer is
// named whatever the status word says: the survivors' kernels see it as a
// timeout, an abort or a host-raised kPeerDead, depending on who noticed first.
inline std::string failure_message(const char* op, int rank, const FailureFacts& f, int64_t timeout_ms) {
  std::string cause;
  if (f.dead_rank >= 0) {
    cause = "rank " + std::to_string(f.dead_rank) + " (pid " + std::to_string(f.dead_pid) +
            ") exited while the group was in use";
  } else if (f.aborted_here) {
    cause = "this rank's process group was aborted";
  } else if (f.status == uint32_t(flags::WaitStatus::kMismatch) && f.mismatch_peer >= 0) {
    // The words of the CPU path's mismatch (shm_comm.cpp).
    cause = "collective mismatch: rank " + std::to_string(rank) + " called " + describe(f.mine) + " but rank " +
            std::to_string(f.mismatch_peer) + " called " + describe(f.theirs);
  } else {
    cause = wait_status_text(f.status);
  }
  if (f.replay_status != 0) {
    cause += std::string("; a CUDA graph replay of all_reduce found it (") + wait_status_text(f.replay_status) +
             ") and returned without reducing: the outputs of that replay and the later ones are not reduced";
  }
  return std::string("fastpar: ") + op + " over CUDA IPC failed on rank " + std::to_string(rank) + ": " + cause +
         " (flag-wait timeout " + std::to_string(timeout_ms) +
         " ms, the group's or the call's timeout); this group's CUDA IPC communicator is unusable, "
         "destroy the group and create a new one";
}

// Whether kernels of the ranks sharing a GPU run at once. Read from the driver
// (cudaDevAttrMpsEnabled: "contexts created on this device will be shared via
// MPS", CUDA 12.x+): it is per context, so it is right for this process, costs
// one attribute query, and needs no guess about the MPS pipe directory
// (CUDA_MPS_PIPE_DIRECTORY, /tmp/nvidia-mps) or whether a daemon seen in
// /proc serves this GPU. -1: the driver could not say.
enum class Mps : int { kUnknown = -1, kOff = 0, kOn = 1 };

inline Mps mps_from_attribute(bool query_ok, int value) {
  if (!query_ok) return Mps::kUnknown;
  return value != 0 ? Mps::kOn : Mps::kOff;
}

// The note for ipc_state and the one-time warning; "" when no rank of the
// group shares its GPU with another rank.
inline std::string gpu_sharing_note(bool group_shares_gpu, Mps mps) {
  if (!group_shares_gpu) return "";
  switch (mps) {
    case Mps::kOn: return "ranks share a GPU, MPS on: their kernels run concurrently";
    case Mps::kOff:
      return "ranks share a GPU without MPS: kernels of different processes time-slice and each collective "
             "takes milliseconds; start the MPS control daemon (nvidia-cuda-mps-control -d) before the processes";
    case Mps::kUnknown: break;
  }
  return "ranks share a GPU and the driver does not say whether MPS is on: without MPS kernels of different "
         "processes time-slice and each collective takes milliseconds";
}

// Whether the one-time warning is due: sharing without (known) MPS.
inline bool sharing_warrants_warning(bool group_shares_gpu, Mps mps) { return group_shares_gpu && mps != Mps::kOn; }

}  // namespace cuda_ipc
}  // namespace fastpar
