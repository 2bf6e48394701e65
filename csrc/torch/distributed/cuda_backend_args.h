// Argument checks and small helpers shared by the CUDA backend's files
// (cuda_backend.cpp, cuda_backend_collectives.cpp, cuda_backend_p2p.cpp).
#pragma once

#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/extension.h>

#include <climits>
#include <optional>
#include <string>
#include <vector>

#include "../../core/algorithms/collective_call.h"  // kForeignDType
#include "../../core/kernels/reduce_ops.h"
#include "../ops/checks.h"  // maybe_dtype

namespace fastpar {
namespace distributed {

using namespace ::fastpar::ops;  // the argument checks (csrc/torch/ops), for this header and its includers

namespace cuda_args {

// The device a call runs on; "undefined" / "on device 'cpu'" for the errors.
inline std::string device_words(const at::Tensor& t) {
  return t.defined() ? "on device '" + t.device().str() + "'" : std::string("undefined");
}

inline void check_cuda(const char* op, const char* arg, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.defined() && t.is_cuda(), "fastpar.", op, ": ", arg, " is ", device_words(t),
                    " but fastpar's CUDA backend handles CUDA tensors only");
}

inline void check_like(const char* op, const std::string& arg, const at::Tensor& t, const at::Tensor& ref,
                const char* ref_name, int64_t numel) {
  TORCH_CHECK_VALUE(t.defined() && t.is_cuda(), "fastpar.", op, ": ", arg, " is ", device_words(t),
                    " but fastpar's CUDA backend handles CUDA tensors only");
  TORCH_CHECK_VALUE(t.scalar_type() == ref.scalar_type(), "fastpar.", op, ": ", arg, " has dtype ", t.scalar_type(),
                    " but ", ref_name, " has dtype ", ref.scalar_type());
  TORCH_CHECK_VALUE(t.numel() == numel, "fastpar.", op, ": ", arg, " has ", t.numel(), " elements but ", numel,
                    " are expected (", ref_name, " has ", ref.numel(), ")");
}

// The dtype the IPC descriptors carry (peers compare it; a mismatch message
// names it): fastpar's DType, or kForeignDType + torch's code for dtypes the
// copy collectives move but fastpar has no element math for.
inline int32_t descriptor_dtype(const at::Tensor& t) {
  const std::optional<DType> d = maybe_dtype(t.scalar_type());
  return d ? int32_t(*d) : kForeignDType + int32_t(t.scalar_type());
}

inline void check_root(const char* op, int64_t root, int size) {
  TORCH_CHECK_VALUE(root >= 0 && root < size, "fastpar.", op, ": root is ", root, " but the group has ", size,
                    " ranks (0..", size - 1, ")");
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

// An all-to-all's block to itself: the bytes a rank sends itself must be
// the bytes it expects from itself (both are its own arguments).
inline void check_own_block(const char* op, int64_t sends, int64_t expects) {
  TORCH_CHECK_VALUE(sends == expects, "fastpar.", op, ": this rank sends itself ", sends, " bytes but expects ",
                    expects, " from itself");
}

// Whether `op` reduces `dt` on the kernels: the route's op_supported.
inline bool reduces(const std::optional<DType>& dt, const c10d::ReduceOp& op) {
  const int v = int(op.op_);
  return dt.has_value() && v >= 0 && v <= 4 && op_supports_dtype(ReduceOp(v), *dt);
}

}  // namespace cuda_args
}  // namespace distributed
}  // namespace fastpar
