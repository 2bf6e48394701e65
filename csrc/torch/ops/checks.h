// Argument checks shared by the CPU and CUDA op implementations.
//
// Every user mistake is caught here, before any work starts, and the message
// names the op, the argument, the index and both values, e.g.
//   "fastpar.allreduce: tensors[1] has dtype torch.float16 but tensors[0] has dtype torch.float32"
// tests/faults/test_errors.py pins these messages.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "../../core/kernels/reduce_ops.h"
#include "../dtypes.h"  // to_dtype, maybe_dtype, dtype_str, indexed

namespace fastpar {
namespace ops {

ReduceOp to_reduce_op(const char* op, int64_t value);

// Non-empty, same dtype / numel, contiguous, one device type. Devices may
// repeat (several entries on cuda:0, or on "cpu"): every entry is its own
// buffer.
void check_tensor_list(const char* op, const char* arg, const at::TensorList& ts, bool same_numel = true);

// For a list the op writes: refuses two entries whose bytes overlap, naming
// both indices (the result would depend on which is written last). Called
// after the op's other checks, so a wrong dtype or op is reported first.
// Read-only inputs may repeat.
void check_no_overlap(const char* op, const char* arg, const at::TensorList& ts);
// A reduction's output (written) against its inputs (read): it shares no byte
// with any, or exactly the elements it receives (the `slice`-th run of its
// numel in that input: in place). At another offset an element is written
// before the read that needs its old value.
void check_output_against_inputs(const char* op, const std::string& name, const at::Tensor& out,
                                 const at::TensorList& inputs, int64_t slice);

// `t` against the first tensor of a list: same dtype, contiguous, same device type.
void check_like(const char* op, const std::string& name, const at::Tensor& t,
                const std::string& ref_name, const at::Tensor& ref);

void check_numel(const char* op, const std::string& name, const at::Tensor& t, int64_t expected,
                 const std::string& why);

// The whole argument check of each list op, shared by the CPU and CUDA
// implementations so both refuse the same calls with the same words.
// Each returns the validated reduce op where there is one.
ReduceOp check_allreduce_args(at::TensorList tensors, int64_t op, const std::string& algorithm);
ReduceOp check_reduce_args(at::TensorList inputs, const at::Tensor& output, int64_t op);
ReduceOp check_reduce_scatter_args(at::TensorList inputs, at::TensorList outputs, int64_t op);
void check_allgather_args(at::TensorList inputs, at::TensorList outputs);
void check_copy_many_args(at::TensorList srcs, at::TensorList dsts);

// check_like without the device-type rule, for sources that may be on the CPU
// while the outputs are CUDA tensors (broadcast from host memory, as
// torch.cuda.comm.broadcast allows): same dtype and contiguous, same messages.
void check_like_any_device(const char* op, const std::string& name, const at::Tensor& t,
                           const std::string& ref_name, const at::Tensor& ref);

}  // namespace ops
}  // namespace fastpar
