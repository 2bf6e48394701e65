// Which transport runs one CUDA allreduce of the c10d backend: CUDA IPC
// (ipc_allreduce.h) or the fallback backend (NCCL through torch.distributed).
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

#include "../../core/transport/cuda_ipc/ipc_arena.h"  // kMaxIpcRanks

namespace fastpar {
namespace cuda_ipc {

enum class Route { kIpc, kFallback };

struct RouteQuery {
  bool peer_access_agreed = false;  // every rank mapped every peer's arena (all-or-nothing)
  int64_t nbytes = 0;               // bytes of this rank's tensor
  bool dtype_supported = false;     // one of the dtypes the reduce kernel knows
  bool op_supported = false;        // SUM/AVG/PRODUCT/MIN/MAX
  bool contiguous = false;          // the kernels read and write flat memory
  bool on_rank_device = false;      // the tensor is on the GPU the arena was set up on
  int world_size = 0;               // IPC needs <= kMaxIpcRanks (the reduce kernel's source limit)
  int64_t max_ipc_bytes = 0;        // agreed by all ranks; 0 disables IPC
  // Whether the fallback (NCCL) can serve this group at all: not when two of
  // its ranks share a GPU (NCCL: "Duplicate GPU detected"). Then the size
  // threshold, which only picks the faster of two working routes, is ignored.
  bool fallback_usable = true;
};

// Default largest IPC allreduce: 8 MiB. IPC one-/two-shot allreduce wins where
// latency dominates: it needs no communicator setup per call and no protocol
// stages, but every rank reads (n-1)/n of every peer's data over the links
// with plain loads, while NCCL (ring / NVLS on NVSwitch) reaches higher bus
// bandwidth on large messages. vLLM's custom allreduce, the same design, stops
// at 8 MiB for 2-8 GPUs and hands larger tensors to NCCL; we take the same
// line until we have GPU measurements of our own. Override with
// FASTPAR_CUDA_IPC_MAX_BYTES (equal on every rank: checked at setup). It
// applies to every collective (the bytes of this rank's input), and not at all
// when ranks share a GPU, where NCCL is no alternative.
constexpr int64_t kDefaultMaxIpcBytes = int64_t(8) << 20;

// Why a call cannot (or, by the threshold, should not) go over IPC; "" when it
// goes over IPC. The first failing condition, in the order below.
inline const char* ipc_refusal(const RouteQuery& q) {
  if (!q.peer_access_agreed) return "CUDA IPC is not set up for this group (see ipc_state)";
  if (q.world_size < 1 || q.world_size > kMaxIpcRanks) return "the group has more ranks than CUDA IPC serves (8)";
  if (!q.dtype_supported) return "the dtype is not one the reduce kernels know";
  if (!q.op_supported) return "the reduce op is not SUM/AVG/PRODUCT/MIN/MAX for this dtype";
  if (!q.contiguous) return "a tensor is not contiguous";
  if (!q.on_rank_device) return "a tensor is not on this rank's CUDA IPC device";
  if (q.max_ipc_bytes <= 0 || q.nbytes < 0) return "FASTPAR_CUDA_IPC_MAX_BYTES=0";
  if (q.nbytes > q.max_ipc_bytes && q.fallback_usable) return "larger than FASTPAR_CUDA_IPC_MAX_BYTES";
  return "";
}

// Every collective of the backend routes with this one rule (broadcast,
// all_gather and the rest set dtype_supported / op_supported to what they
// need: byte copies need neither).
inline Route route_ipc(const RouteQuery& q) { return *ipc_refusal(q) == '\0' ? Route::kIpc : Route::kFallback; }

inline Route route_allreduce(const RouteQuery& q) { return route_ipc(q); }

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
