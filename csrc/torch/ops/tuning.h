// Knobs the schedules read at call time. Defaults come from the benchmarks
// (benchmarks/); tests shrink the ring segment so tiny tensors cross many
// windows and exercise the multi-chunk path.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace fastpar {
namespace ops {

// How the CUDA list ops treat entries that share a GPU. kReal: as they are
// (one launch on the GPU's current stream). The other two are for tests on a
// machine with one GPU, so that the branches for entries on distinct GPUs run
// there before they first run on several: every entry is taken to be on a
// GPU of its own, with side streams and events as across GPUs, and with peer
// access between the entries (kDistinctPeer: kernels read the other entries
// in place) or without it (kDistinctStaging: cudaMemcpyPeerAsync copies into
// staging buffers first). The ring's ranks get a stream each, so its events
// between ranks' streams run too. What one GPU cannot stand in for: enabling
// peer access between two GPUs, an event of one GPU waited on by another's
// stream, a copy between two GPUs' memories.
enum class DeviceModel { kReal, kDistinctPeer, kDistinctStaging };

struct Tuning {
  // Bytes per ring segment; a window (the pipelining unit) is n segments.
  int64_t ring_segment_bytes = 1 << 20;
  // All entries on one GPU: the ring in one launch (ring_one_gpu.h) instead of
  // one launch per segment. Off until the one-launch kernel has run on a GPU
  // (it has run in the host emulation only); benchmarks and tests turn it on.
  bool ring_one_launch = false;
  DeviceModel device_model = DeviceModel::kReal;
};

Tuning& tuning();

// The names of DeviceModel ("real", "distinct_peer", "distinct_staging"), and
// the one a name gives (a ValueError naming the argument otherwise).
const char* device_model_name(DeviceModel m);
DeviceModel device_model_from(const std::string& name);

// Which path the CUDA list ops took, counted since the process started (the
// tests check that a device model reached the branches it is for).
struct ListOpPaths {
  std::atomic<int64_t> allreduce_one_launch{0};  // every entry on one GPU: one kernel
  std::atomic<int64_t> allreduce_direct{0};      // a kernel per shard, on side streams
  std::atomic<int64_t> allreduce_ring{0};
  std::atomic<int64_t> staging_buffers{0};       // a peer's bytes read through a copy on the reader's GPU
};
ListOpPaths& list_op_paths();

}  // namespace ops
}  // namespace fastpar
