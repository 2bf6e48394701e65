// Knobs the schedules read at call time. Defaults are measured (see
// benchmarks/); tests shrink the ring segment so tiny tensors cross many
// windows and exercise the multi-chunk path.
#pragma once

#include <cstdint>

namespace fastpar {
namespace ops {

struct Tuning {
  // Bytes per ring segment; a window (the pipelining unit) is n segments.
  int64_t ring_segment_bytes = 1 << 20;
  // All entries on one GPU: the ring in one launch (ring_one_gpu.h) instead of
  // one launch per segment. Off until the one-launch kernel has run on a GPU
  // (it has run in the host emulation only); benchmarks and tests turn it on.
  bool ring_one_launch = false;
};

Tuning& tuning();

}  // namespace ops
}  // namespace fastpar
