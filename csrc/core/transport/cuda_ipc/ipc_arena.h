// Layout of one rank's IPC arena: a single cudaMalloc allocation that the rank
// exports with cudaIpcGetMemHandle and every peer process maps.
//
//   [ flags::ControlBlock | status word | pad ]  512 bytes, then the
//   [ block flags of the one-kernel calls ]      kTwoShotMaxBlocks cache lines
//   [ Inbox | pad ]                              to kHeaderBytes (the other
//                                                form of those flags, below)
//   [ data slot 0 ]                              slot_bytes (rounded to 512)
//   [ data slot 1 ]                              (flags::kSlots rotating slots)
//   [ P2PControl | pad ]                         kP2PControlBytes
//   [ p2p rings: per destination kP2PChunks ]    kMaxIpcRanks * kP2PChunks * kP2PChunkBytes
//   [ GraphControl | pad ]                       kGraphControlBytes
//   [ graph slots 0 and 1 ]                      2 x slot_bytes (rounded to 512;
//                                                replays alternate them)
//   [ registered buffers ]                       registered_bytes (rounded to 512;
//                                                FASTPAR_CUDA_IPC_REGISTERED_BYTES)
//
// The p2p region (send/recv, p2p_ring.h) is apart from the collective slots so
// that point-to-point traffic on its own streams never touches a slot a
// collective is using. The graph region (the all_reduce that CUDA graphs can
// capture, ipc_graph.h) is apart for the same reason: a replayed kernel's
// pointers were fixed at capture, so it cannot take its turn in the eager
// slots' rotation; it alternates two slots of its own by the replay's parity.
//
// Registered buffers (registered_empty on CUDA) are tensors the caller
// allocates inside the arena: peers read them where the caller wrote them, so
// the allreduce on them needs no copy-in (allreduce_slots.h,
// allreduce_registered).
//
// Only the owner writes its arena (the protocol's single-writer rule), but
// for the inboxes (Inbox: each word of one is written by one peer only);
// peers read the control block and the slots through their mapping. The status word
// is the owner's private record of a failed phase (a flags::WaitStatus): every
// later kernel of the transport checks it and does nothing, and the host reads
// it to raise the error.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../flag_protocol.h"

namespace fastpar {
namespace cuda_ipc {

// Slot size of an arena: messages larger than a slot go through
// it in chunks. 8 MiB keeps the per-chunk phase overhead small against the
// transfer time at NVLink speeds; the arena is three slots,
// the two graph slots, the p2p rings (4 MiB) and headers: 44 MiB of device
// memory per rank.
constexpr int64_t kDefaultSlotBytes = int64_t(8) << 20;


constexpr int kMaxIpcRanks = 8;  // = the reduce kernel's source limit: one per GPU of a node
// Blocks of the fused two-shot kernel (executors/cuda_ipc/ipc_fused_two_shot.h),
// the most of any one-kernel call. Every eager one-kernel call (the fused
// one-shot, two-shot and collectives) has one flag per block, each on a cache
// line of its own (written by one block, spun on by the same block of every
// peer), after the header's first 512 bytes: block_flags_of.
constexpr int kTwoShotMaxBlocks = 128;
constexpr size_t kBlockFlagsOffset = 512;
constexpr size_t kSlotAlign = 512;  // keeps every slot 16-byte aligned for the uint4 path

static_assert(sizeof(flags::ControlBlock) + sizeof(uint32_t) <= kBlockFlagsOffset, "header overflows");

// How the one-kernel calls' block barriers pass a block's arrival
// (executors/cuda_ipc/phase_step.h, BlockPhase and ipc_graph.h's GraphPhase),
// equal on every rank (IpcComm::flag_form):
//   kPollPeer      block b of the arriving rank release-stores its own flag
//                  (block_flags_of, GraphControl::start) and every waiter
//                  polls that word in the arriving rank's memory with acquire
//                  loads: over NVLink or PCIe where the ranks have GPUs of
//                  their own. The default.
//   kWaiterMemory  the arriving rank writes its arrival into every peer's
//                  Inbox (a release store per peer, by the thread that waits
//                  for that peer), and each waiter polls its own memory with
//                  relaxed loads, then one acquire load of the word it saw
//                  reach the phase (vLLM's and TensorRT-LLM's form). A
//                  measured alternative: the first GPU run decides which of
//                  the two stays.
enum class FlagForm : int32_t { kPollPeer = 0, kWaiterMemory = 1 };

// A rank's inbox for the kWaiterMemory form: word[b][s] is the last phase
// block b of rank s has reached, written by rank s only; desc[s][seq % 2] is
// rank s's descriptor of phase seq, written by its block 0 before that
// block's word (flags::ControlBlock's rotation by two: a writer is at most one
// phase ahead of a reader that has not posted the next phase). A block's
// words for its n sources share one cache line: its waiting threads poll the
// line together.
struct Inbox {
  uint64_t word[kTwoShotMaxBlocks][kMaxIpcRanks];
  flags::OpDesc desc[kMaxIpcRanks][flags::kDescSlots];
};

constexpr size_t kInboxOffset = kBlockFlagsOffset + size_t(kTwoShotMaxBlocks) * 64;
constexpr size_t kHeaderBytes = (kInboxOffset + sizeof(Inbox) + kSlotAlign - 1) / kSlotAlign * kSlotAlign;

FASTPAR_HD size_t slot_stride(size_t slot_bytes) { return (slot_bytes + kSlotAlign - 1) / kSlotAlign * kSlotAlign; }

// The header and the collective slots.
FASTPAR_HD size_t collective_bytes(size_t slot_bytes) {
  return kHeaderBytes + size_t(flags::kSlots) * slot_stride(slot_bytes);
}

constexpr int kP2PChunks = 4;
// 128 KiB: 8 peers x 4 chunks = 4 MiB of p2p region per rank's arena; a
// message takes ceil(bytes / chunk) chunks of three launches per side.
constexpr size_t kP2PChunkBytes = size_t(128) << 10;

struct P2PHeader {
  uint64_t seq;    // the chunk number this header describes
  int64_t tag;
  int64_t total;   // bytes of the whole message
  int64_t offset;  // of this chunk in the message
};

// Counters one per cache line: the receiver spins on posted[d], the sender
// on consumed[s], each written by one process.
struct alignas(64) P2PCounter {
  uint64_t value;
  uint64_t pad[7];
};

struct P2PControl {
  P2PCounter posted[kMaxIpcRanks];    // [d]: chunks published to rank d
  P2PCounter consumed[kMaxIpcRanks];  // [s]: chunks read from rank s
  P2PHeader hdr[kMaxIpcRanks][kP2PChunks];
};

constexpr size_t kP2PControlBytes = (sizeof(P2PControl) + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
constexpr size_t kP2PRegionBytes = kP2PControlBytes + size_t(kMaxIpcRanks) * kP2PChunks * kP2PChunkBytes;

// The p2p region starts after the collective slots (arena_bytes counts it).
FASTPAR_HD P2PControl* p2p_control_of(void* base, size_t slot_bytes) {
  return reinterpret_cast<P2PControl*>(static_cast<char*>(base) + collective_bytes(slot_bytes));
}

// Ring slot of chunk `seq` (1-based) from the arena's owner to rank `dst`.
FASTPAR_HD char* p2p_chunk_of(void* base, size_t slot_bytes, int dst, uint64_t seq) {
  const size_t k = size_t((seq - 1) % kP2PChunks);
  return reinterpret_cast<char*>(p2p_control_of(base, slot_bytes)) + kP2PControlBytes +
         (size_t(dst) * kP2PChunks + k) * kP2PChunkBytes;
}

// Blocks of the fused one-shot kernels (ipc_fused_one_shot.h): their per-block
// flags have room for this many.
constexpr int kFusedMaxBlocks = 16;

// One word per cache line: each is written by one process, spun on by others.
struct alignas(64) FlagLine {
  uint64_t value;
  uint64_t pad[7];
};
static_assert(sizeof(FlagLine) == 64, "one flag per cache line");

// The block flags of the eager one-kernel calls: flag b is the last phase
// (flags::OpDesc::seq) block b of the owner has posted. Phases are numbered
// by one counter for every call of a communicator, so the flags only grow,
// whichever kernel and block count posted them last.
FASTPAR_HD FlagLine* block_flags_of(void* base) {
  return reinterpret_cast<FlagLine*>(static_cast<char*>(base) + kBlockFlagsOffset);
}

// The eager one-kernel calls' inbox (kWaiterMemory) of the arena at `base`
// (its control block: control_of(base) == base).
FASTPAR_HD Inbox* inbox_of(void* base) { return reinterpret_cast<Inbox*>(static_cast<char*>(base) + kInboxOffset); }

// The graph region's control (owner-written). Per block b, the barrier
// phase block b of this rank's graphed calls has reached (`start`, spun on by
// block b of every peer: phase j of epoch e posts 2e + j), for as many blocks
// as any eager grid has, since a replay runs the grid of the eager call of its
// size. The graphed calls this rank has completed (`epoch`) and the blocks of
// the running one that have finished (`arrived`), both read and written by
// this rank's kernels only (ipc_graph.h, graph_finish). Block 0's descriptor
// of each call, in the entry of the call's parity (a peer reads epoch e's
// while this rank may already write e + 1's). The inbox of the kWaiterMemory
// form: the peers' arrivals (2e + j) and descriptors (by parity).
struct GraphControl {
  FlagLine start[kTwoShotMaxBlocks];
  FlagLine epoch;
  FlagLine arrived;
  flags::OpDesc desc[2];
  Inbox inbox;
};

constexpr size_t kGraphControlBytes = (sizeof(GraphControl) + kSlotAlign - 1) / kSlotAlign * kSlotAlign;

FASTPAR_HD GraphControl* graph_control_of(void* base, size_t slot_bytes) {
  return reinterpret_cast<GraphControl*>(static_cast<char*>(base) + collective_bytes(slot_bytes) + kP2PRegionBytes);
}

// Graph slot `parity` (0 or 1): a replay of epoch e uses slot e % 2.
FASTPAR_HD char* graph_slot_of(void* base, size_t slot_bytes, int parity = 0) {
  return reinterpret_cast<char*>(graph_control_of(base, slot_bytes)) + kGraphControlBytes +
         size_t(parity) * slot_stride(slot_bytes);
}

// The registered buffers' region: after the graph slots.
FASTPAR_HD char* registered_of(void* base, size_t slot_bytes) {
  return graph_slot_of(base, slot_bytes, 2);
}

FASTPAR_HD size_t arena_bytes(size_t slot_bytes, size_t registered_bytes) {
  return collective_bytes(slot_bytes) + kP2PRegionBytes + kGraphControlBytes + 2 * slot_stride(slot_bytes) +
         slot_stride(registered_bytes);
}

FASTPAR_HD flags::ControlBlock* control_of(void* base) { return static_cast<flags::ControlBlock*>(base); }

FASTPAR_HD uint32_t* status_of(void* base) {
  return reinterpret_cast<uint32_t*>(static_cast<char*>(base) + sizeof(flags::ControlBlock));
}

FASTPAR_HD char* slot_of(void* base, size_t slot_bytes, int k) {
  return static_cast<char*>(base) + kHeaderBytes + size_t(k) * slot_stride(slot_bytes);
}

}  // namespace cuda_ipc
}  // namespace fastpar
