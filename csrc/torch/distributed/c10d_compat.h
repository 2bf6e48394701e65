#pragma once
// Names of c10d that differ between the torch releases fastpar builds against.
// The GPU machine runs torch 2.11 while CI builds with 2.14, so a name that
// only newer torch has must come through here (scripts/check_torch_compat.py
// compiles every torch-facing source against the older headers).
#include <torch/headeronly/version.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace fastpar::distributed {

#define FASTPAR_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// The op types a Work reports for the tensor forms of coalesced collectives:
// torch 2.12 added REDUCE_SCATTER_TENSOR_COALESCED, torch 2.14
// ALLGATHER_INTO_TENSOR_COALESCED; before them ProcessGroupNCCL reported
// COALESCED, and so do we.
#if FASTPAR_TORCH_AT_LEAST(2, 14)
inline constexpr c10d::OpType kAllgatherIntoTensorCoalesced = c10d::OpType::ALLGATHER_INTO_TENSOR_COALESCED;
#else
inline constexpr c10d::OpType kAllgatherIntoTensorCoalesced = c10d::OpType::COALESCED;
#endif
#if FASTPAR_TORCH_AT_LEAST(2, 12)
inline constexpr c10d::OpType kReduceScatterTensorCoalesced = c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED;
#else
inline constexpr c10d::OpType kReduceScatterTensorCoalesced = c10d::OpType::COALESCED;
#endif

}  // namespace fastpar::distributed
