// One process's end of a CUDA IPC communicator: its arena (ipc_arena.h), the
// host-mapped mirror of its status word, and its mappings of the peers'
// arenas. The c10d CUDA engine (csrc/torch/distributed/cuda_engine.cpp)
// holds one per group; its handles travel through the group's c10d::Store
// (cuda_ipc_rendezvous.h).
//
// Lifecycle: create() -> export_handle() -> (exchange) -> connect(handles)
// -> allreduce_one_shot / allreduce_two_shot on comm() -> disconnect() ->
// free_arena(). Peers read this rank's arena until they have finished their
// own last collective, so free_arena() must follow a barrier with them;
// where no barrier is possible, abandon_arena() leaves the allocation to the
// driver, which frees it when the process exits. The destructor, which runs
// without a barrier, abandons an arena it finds still allocated.
//
// Torch-free: every function returns the first cudaError_t it meets and makes
// the endpoint's device current for the call only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "ipc_comm.h"
#include "ipc_failure.h"  // wait_status_text

namespace fastpar {
namespace cuda_ipc {

class IpcEndpoint {
 public:
  IpcEndpoint() = default;
  // Best effort: disconnect(), abandon_arena() (free_arena() if the arena's
  // handle was never exported: no peer can have mapped it), then the pinned
  // host words; errors cannot leave a destructor.
  ~IpcEndpoint();
  IpcEndpoint(const IpcEndpoint&) = delete;
  IpcEndpoint& operator=(const IpcEndpoint&) = delete;

  // Allocates the arena (slot_bytes per slot, registered_bytes of registered
  // buffers) on `device` and the pinned host words. rank/size as in IpcComm;
  // size <= kMaxIpcRanks. Once per endpoint.
  cudaError_t create(int rank, int size, int device, size_t slot_bytes, size_t registered_bytes = 0);
  cudaError_t export_handle(cudaIpcMemHandle_t* handle);
  // Maps every peer's arena; handles[q] is rank q's (handles[rank] is not
  // read). On failure the mappings made so far are undone.
  cudaError_t connect(const cudaIpcMemHandle_t* handles);
  // Waits for all work on the device (any stream may still read a mapping),
  // then unmaps the peers' arenas.
  cudaError_t disconnect();
  // Frees the own arena: only once no peer reads it, i.e. after a barrier
  // with every peer that follows its last call (the destructor frees only an
  // arena whose handle was never exported).
  cudaError_t free_arena();
  // Forgets the own arena without freeing it (see above).
  void abandon_arena();
  // Neither frees the host words (status mirror, abort word, mismatch
  // record): host threads may touch them for as long as the endpoint lives
  // (abort() racing a shutdown, a Work asking for its status), so only the
  // destructor frees them.

  bool created() const { return c_.bases[c_.rank] != nullptr; }
  bool connected() const { return connected_; }
  // The step a call of this rank could not enqueue (ipc_steps.h,
  // fail_enqueue), or cudaSuccess; once set, every later call returns it.
  cudaError_t enqueue_error() const { return c_.enqueue_error; }
  IpcComm& comm() { return c_; }
  const IpcComm& comm() const { return c_; }
  // The failure a phase kernel recorded (0: none), read without synchronizing:
  // it lags the device by the kernels still queued.
  uint32_t host_status() const;
  // The failure a CUDA graph replay of this rank found (0: none), read as
  // host_status.
  uint32_t replay_failure() const;
  // The first mismatched call a phase kernel of this rank recorded (the
  // peer, both descriptors); false when none.
  bool mismatch(int* peer, flags::OpDesc* mine, flags::OpDesc* theirs) const;
  // Makes waiting phase kernels of this rank give up with `code` (a
  // flags::WaitStatus), and every later one fail at once; never blocks, so
  // the peer watcher and abort() may call it while a kernel spins. The first
  // code stays. Thread-safe.
  void raise_host_abort(uint32_t code);
  uint64_t host_abort() const;

 private:
  IpcComm c_;
  // One pinned, host-mapped allocation: the status mirror, the replays'
  // failure word and the mismatch record (device -> host) and the host abort
  // word (host -> device).
  uint32_t* host_status_ = nullptr;         // host address of c_.host_status
  uint64_t* host_abort_ = nullptr;          // host address of c_.host_abort
  MismatchRecord* host_mismatch_ = nullptr;  // host address of c_.host_mismatch
  uint32_t* host_replay_failure_ = nullptr;  // host address of c_.host_replay_failure
  bool connected_ = false;
  bool exported_ = false;  // a handle to the arena left this process
  // The device was synchronized after our last kernel (free_arena, or an
  // abandon_arena whose synchronize succeeded): the host words are unused.
  bool device_idle_ = false;
};

// The words of an IPC call that could not be enqueued, or that is refused
// because an earlier one could not (`earlier`): this rank is out of step
// with its peers for good (ipc_steps.h, fail_enqueue).
inline std::string enqueue_failure_message(const char* op, int rank, cudaError_t err, bool earlier) {
  return std::string("fastpar: ") + op + " over CUDA IPC failed on rank " + std::to_string(rank) + ": " +
         (earlier ? "an earlier call" : "this call") + " could not enqueue a step (CUDA error: " +
         cudaGetErrorString(err) + "), so this rank is out of step with its peers; its abort word is raised, "
         "which ends their waits too, and this CUDA IPC communicator is unusable";
}

}  // namespace cuda_ipc
}  // namespace fastpar
