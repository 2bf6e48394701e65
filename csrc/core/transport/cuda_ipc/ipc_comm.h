// One rank's view of a CUDA IPC communicator (IpcComm): its arena and its
// mappings of the peers', the host words through which host and kernels tell
// each other of failures, and the counters every rank advances alike. The
// endpoint (ipc_endpoint.h) builds it; the executors (executors/cuda_ipc/)
// run schedules on it. Torch-free.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "../flag_protocol.h"
#include "ipc_arena.h"

namespace fastpar {
namespace cuda_ipc {

// What a rank that finds a peer in a different call leaves for its host's
// error message, in host-mapped pinned memory (the host reads it without
// synchronizing a stream, as it reads the status mirror): both descriptors
// and the peer, as the CPU path's message names them. The first mismatch
// wins; peer_plus_one is release-stored after the descriptors.
struct MismatchRecord {
  flags::OpDesc mine;
  flags::OpDesc theirs;
  uint64_t peer_plus_one;  // 0: nothing recorded
};

// One rank's view of the communicator. Built by the caller after exchanging
// handles: bases[rank] is this rank's own arena, bases[q] peer q's as mapped here.
struct IpcComm {
  int rank = 0;
  int size = 0;
  int device = 0;  // this rank's GPU (the arena's and the stream's)
  // Ranks of this communicator on this rank's GPU, this one included (the
  // front end knows it from the setup's exchange of GPU identities; equal on the
  // ranks of one GPU). The data kernels' grids are divided among them
  // (core/kernels/launch_shape.h). 1: this rank has its GPU to itself.
  int gpu_sharers = 1;
  void* bases[kMaxIpcRanks] = {};
  size_t slot_bytes = 0;
  size_t registered_bytes = 0;  // the registered buffers' region (ipc_arena.h), equal on every rank
  uint64_t timeout_ns = 120ull * 1000 * 1000 * 1000;  // a wait this long means a peer is gone
  // Optional device pointer to a host-mapped (pinned) mirror of the status
  // word: a failed phase writes it too, so the host can see the failure
  // without synchronizing any stream (null: no mirror).
  uint32_t* host_status = nullptr;
  // Optional device pointer to the host abort word (pinned, host-mapped): the
  // host writes a flags::WaitStatus there (a peer died, abort()) and waiting
  // phase kernels give up with it (phase_step.h). Null: none.
  const uint64_t* host_abort = nullptr;
  // Optional device pointer to the host-mapped mismatch record
  // (phase_launch.h): both calls, for the host's error message. Null: none.
  MismatchRecord* host_mismatch = nullptr;
  // Optional device pointer to the host-mapped failure word of CUDA graph
  // replays (ipc_fused_one_shot.h, graph_failed): the status of a replay that
  // failed or found an earlier failure, for the host's next call to raise
  // naming it (a replay cannot). Null: none.
  uint32_t* host_replay_failure = nullptr;
  // Host address of the host abort word (host_abort is its device view), for
  // the host itself to raise when a call cannot be enqueued (ipc_steps.h,
  // fail_enqueue). Null: none.
  uint64_t* host_abort_host = nullptr;
  // The first step this rank could not enqueue (a launch or copy error), or
  // cudaSuccess. Once set, this rank is out of step with its peers and every
  // later call returns it without enqueueing anything (ipc_steps.h).
  cudaError_t enqueue_error = cudaSuccess;
  uint64_t seq = 0;     // last phase posted (the protocol's phase number)
  uint64_t rounds = 0;  // slot rounds started; slot = rounds % flags::kSlots
  // One-shot calls that fit one slot run as one fused kernel
  // (ipc_fused_one_shot.h). Must be equal on every rank (a mix fails with a
  // descriptor mismatch); the unfused path stays for comparison and tests.
  bool fused_one_shot = true;
  // Two-shot calls run as one fused kernel, every size (ipc_fused_two_shot.h);
  // false (the default, the form that has run on a GPU): the step-by-step
  // schedule (2mn + 1 stream operations for m chunks). Equal on every rank,
  // as fused_one_shot (a mix fails with a mismatch).
  bool fused_two_shot = false;
  // broadcast, gather, scatter, all_to_all, reduce and reduce_scatter run as
  // one fused kernel per call (executors/cuda_ipc/ipc_fused_collectives.h);
  // false (the default, as fused_two_shot): the step-by-step schedules. Equal
  // on every rank (a mix fails with a mismatch naming schedule=fused).
  bool fused_collectives = false;
  // How the one-kernel calls' block barriers pass arrivals (ipc_arena.h,
  // FlagForm): kPollPeer, the default, or the measured alternative
  // kWaiterMemory (the test hook only). Equal on every rank (a mix fails with a
  // mismatch naming flags=waiter, or a peer's abort).
  FlagForm flag_form = FlagForm::kPollPeer;
  // Bytes per block of the fused kernel (ipc_fused_one_shot.h; equal on every
  // rank; the host emulation lowers it so that small calls get many blocks).
  int64_t fused_bytes_per_block = 16 * 1024;
  // The most blocks of one rank's fused two-shot or collectives grid
  // (fused_grid_blocks below, set at setup; equal on every rank); 0: as if
  // every rank shared one GPU of kTwoShotMaxBlocks resident blocks.
  int fused_grid_blocks = 0;
  // Point-to-point chunk numbers (p2p_ring.h), counted at enqueue time:
  // chunks enqueued to rank d / from rank s so far.
  uint64_t p2p_sent[kMaxIpcRanks] = {};
  uint64_t p2p_received[kMaxIpcRanks] = {};
};

// Blocks per SM the fused two-shot and collectives kernels are built to keep
// resident (their __launch_bounds__ minimum, which their .cu files assert).
constexpr int kFusedGridBlocksPerSm = 1;

// SMs of each GPU the fused grids leave to other work: a stray kernel (the
// caller's, another process's) then finds an SM free instead of delaying a
// block of the grid by a whole wave while that block's peers spin.
constexpr int kFusedSpareSms = 2;

// IpcComm::fused_grid_blocks of a group whose GPUs have at least `sms` SMs
// (0: unknown) and at most `sharers` ranks on one GPU. Block b of every rank
// waits for block b of the others, so the grids of all ranks on a GPU must be
// resident together: they share its SMs but kFusedSpareSms, at
// kFusedGridBlocksPerSm (an A100's 106, not kTwoShotMaxBlocks), never past
// the arena's kTwoShotMaxBlocks flags.
inline int fused_grid_blocks(int sms, int sharers) {
  if (sharers < 1) sharers = 1;
  int total = sms > 0 ? (sms - kFusedSpareSms) * kFusedGridBlocksPerSm : kTwoShotMaxBlocks;
  if (total > kTwoShotMaxBlocks) total = kTwoShotMaxBlocks;
  return total / sharers < 1 ? 1 : total / sharers;
}

// The grid cap of `c`'s fused two-shot and collectives calls.
inline int fused_grid_cap(const IpcComm& c) {
  return c.fused_grid_blocks > 0 ? c.fused_grid_blocks : fused_grid_blocks(0, c.size);
}

// Raises a host abort word (host address) to `code`, unless a code is there
// already: the first cause stands. Release, pairing with the kernels'
// ld.acquire.sys of the word. For IpcEndpoint::raise_host_abort (a dead peer,
// abort()) and ipc_steps::fail_enqueue (a step that could not be enqueued).
inline void raise_abort_word(uint64_t* word, uint64_t code) {
  uint64_t expected = 0;
  __atomic_compare_exchange_n(word, &expected, code, false, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
}

}  // namespace cuda_ipc
}  // namespace fastpar
