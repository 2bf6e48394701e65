// Which transport runs one CUDA allreduce of the c10d backend: CUDA IPC
// (allreduce_ipc.h) or the fallback backend (NCCL through torch.distributed).
//
// Pure, host-only and torch-free so that ctest checks it (tests/cpp/test_route.cpp).
// The rule that matters: every rank must take the same route for the same
// call, or one rank waits on IPC flags while another waits inside NCCL until
// the timeout. So the inputs are either facts the collective rules already
// make equal on every rank (size, dtype, op, memory layout: NCCL reduces in
// storage order, so ranks with different layouts would already disagree) or
// facts the ranks agreed on at setup (peer access, max_ipc_bytes, world size).
#pragma once

#include <cstdint>

#include "ipc_arena.h"  // kMaxIpcRanks

namespace fastpar {
namespace cuda_ipc {

enum class Route { kIpc, kFallback };

struct RouteQuery {
  bool peer_access_agreed = false;  // every rank mapped every peer's arena (all-or-nothing)
  int64_t nbytes = 0;               // bytes of this rank's tensor
  bool dtype_supported = false;     // one of the dtypes the reduce kernel knows
  bool op_supported = false;        // SUM/AVG/PRODUCT/MIN/MAX, and AVG only on floating dtypes
  bool contiguous = false;          // the kernels read and write flat memory
  bool on_rank_device = false;      // the tensor is on the GPU the arena was set up on
  int world_size = 0;               // IPC needs <= kMaxIpcRanks (the reduce kernel's source limit)
  int64_t max_ipc_bytes = 0;        // agreed by all ranks; 0 disables IPC
};

// Default largest IPC allreduce: 8 MiB. IPC one-/two-shot allreduce wins where
// latency dominates: it needs no communicator setup per call and no protocol
// stages, but every rank reads (n-1)/n of every peer's data over the links
// with plain loads, while NCCL (ring / NVLS on NVSwitch) reaches higher bus
// bandwidth on large messages. vLLM's custom allreduce, the same design, stops
// at 8 MiB for 2-8 GPUs and hands larger tensors to NCCL; we take the same
// line until we have GPU measurements of our own. Override with
// FASTPAR_CUDA_IPC_MAX_BYTES (equal on every rank: checked at setup).
constexpr int64_t kDefaultMaxIpcBytes = int64_t(8) << 20;

inline Route route_allreduce(const RouteQuery& q) {
  const bool ok = q.peer_access_agreed && q.dtype_supported && q.op_supported && q.contiguous &&
                  q.on_rank_device && q.world_size >= 1 && q.world_size <= kMaxIpcRanks && q.max_ipc_bytes > 0 &&
                  q.nbytes >= 0 && q.nbytes <= q.max_ipc_bytes;
  return ok ? Route::kIpc : Route::kFallback;
}

// Parses a byte count given in an environment variable: decimal digits only
// (no sign, no suffix), at most 2^62. Returns false for anything else, so a
// typo is reported instead of silently picking a route.
inline bool parse_byte_count(const char* s, int64_t* out) {
  if (s == nullptr || *s == '\0') return false;
  int64_t v = 0;
  for (const char* p = s; *p; ++p) {
    if (*p < '0' || *p > '9') return false;
    if (v > (int64_t(1) << 62) / 10) return false;
    v = v * 10 + (*p - '0');
  }
  if (v > (int64_t(1) << 62)) return false;
  *out = v;
  return true;
}

}  // namespace cuda_ipc
}  // namespace fastpar
