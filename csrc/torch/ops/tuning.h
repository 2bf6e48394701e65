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
};

Tuning& tuning();

}  // namespace ops
}  // namespace fastpar
