// Small helpers shared by the CUDA engine's files (cuda_engine.cpp,
// cuda_engine_collectives.cpp, cuda_engine_p2p.cpp).
#pragma once

#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/extension.h>

#include <climits>
#include <optional>
#include <string>
#include <vector>

#include "../../core/transport/collective_call.h"  // kForeignDType
#include "../../core/kernels/reduce_ops.h"
#include "../ops/checks.h"  // maybe_dtype

namespace fastpar {
namespace distributed {

namespace cuda_args {

// The dtype the IPC descriptors carry (peers compare it; a mismatch message
// names it): fastpar's DType, or kForeignDType + torch's code for dtypes the
// copy collectives move but fastpar has no element math for.
inline int32_t descriptor_dtype(const at::Tensor& t) {
  const std::optional<DType> d = ops::maybe_dtype(t.scalar_type());
  return d ? int32_t(*d) : kForeignDType + int32_t(t.scalar_type());
}

// The tag of the messages all_to_all_pairs sends: no int tag of a user's
// send can equal it, so a user's message and an all-to-all's between the same
// two ranks can never be taken for one another.
constexpr int64_t kAllToAllTag = INT64_MIN + 1;

// Output list entries the kernels cannot write directly: add() returns `t`'s
// data if contiguous, else a contiguous temporary's, whose copy back into `t`
// finish() queues (on the current stream, after the kernels).
struct StagedOutputs {
  std::vector<at::Tensor> user, staged;
  void* add(const at::Tensor& t) {
    if (t.is_contiguous()) return t.data_ptr();
    user.push_back(t);
    staged.push_back(at::empty_like(t, at::MemoryFormat::Contiguous));
    return staged.back().data_ptr();
  }
  void finish() {
    for (size_t i = 0; i < user.size(); ++i) user[i].copy_(staged[i]);
  }
};

// Whether `op` reduces `dt` on the kernels: the route's op_supported.
inline bool reduces(const std::optional<DType>& dt, const c10d::ReduceOp& op) {
  const int v = int(op.op_);
  return dt.has_value() && v >= 0 && v <= 4;  // every op reduces every kernel dtype
}

}  // namespace cuda_args
}  // namespace distributed
}  // namespace fastpar
