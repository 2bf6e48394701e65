// The c10d backend's CUDA IPC setup and teardown over the group's Store: the
// peer-access probe, the agreement rounds, the handle exchange. Collective:
// every rank of the group calls it at the same point (the first CUDA
// all_reduce, as NCCL creates its communicator lazily), and every rank comes
// out with the same answer: all ranks on IPC, or none.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "../../core/transport/cuda_ipc/ipc_endpoint.h"

namespace fastpar {
namespace distributed {

struct IpcRendezvous {
  std::shared_ptr<cuda_ipc::IpcEndpoint> endpoint;  // connected, or null: use the fallback
  std::string why_not;                              // when null: the reason, identical on every rank
  // From the cfg round, so identical on every rank whatever the outcome:
  bool group_shares_gpu = false;  // two ranks of the group are on one GPU (gpu_placement.h)
  int ranks_on_my_gpu = 1;        // ranks on this rank's GPU, this one included (IpcComm::gpu_sharers)
  int fused_grid_blocks = 0;      // IpcComm::fused_grid_blocks: the fewest SMs x blocks per SM / the most ranks on a GPU
  std::vector<int64_t> pids;      // rank q's process id (for the peer watcher)
};

// Rounds (each: every rank publishes one key, then reads all ranks' keys):
//   cfg     max_ipc_bytes, slot_bytes, registered_bytes, the GPU (PCI bus id
//           and UUID), pid, SM count (differing knobs: an error
//           on every rank)
//   probe   "can I map every peer": the peer's GPU is visible here (by bus id
//           and UUID; not another MIG instance of this rank's GPU), and it is
//           this rank's own GPU (a peer process on the same device:
//           cudaIpcOpenMemHandle maps memory of another process on one
//           device; only the same process could not) or
//           cudaDeviceCanAccessPeer says yes
//   handle  the arena's cudaIpcMemHandle_t (or why allocating it failed)
//   open    whether mapping every peer's arena worked
//   unwind  (only after a failed open) every rank has unmapped: arenas may go
// A rank that does not publish a round within `timeout` makes the others
// raise DistBackendError naming it.
IpcRendezvous ipc_rendezvous(c10d::Store& store, int rank, int size, int device, int64_t max_ipc_bytes,
                             int64_t slot_bytes, int64_t registered_bytes, std::chrono::milliseconds timeout);

// Teardown barrier ("bye" round) before the arena is freed: peers read it
// until they finish their last collective. Returns false (never throws) when
// some rank did not arrive within `timeout`; the caller then abandons the
// arena instead of freeing it.
bool ipc_farewell(c10d::Store& store, int rank, int size, std::chrono::milliseconds timeout) noexcept;

}  // namespace distributed
}  // namespace fastpar
