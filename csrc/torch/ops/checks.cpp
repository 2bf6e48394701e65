#include "checks.h"

#include <sstream>

namespace fastpar {
namespace ops {

static std::string device_str(const at::Tensor& t) { return "'" + t.device().str() + "'"; }

ReduceOp to_reduce_op(const char* op, int64_t value) {
  TORCH_CHECK_VALUE(value >= 0 && value <= 4, "fastpar.", op, ": op has value ", value,
                    ", which is not one of ReduceOp.SUM (0), AVG (1), PRODUCT (2), MIN (3), MAX (4)");
  return ReduceOp(value);
}

void check_like(const char* op, const std::string& name, const at::Tensor& t,
                const std::string& ref_name, const at::Tensor& ref) {
  TORCH_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), "fastpar.", op, ": ", name, " has dtype ",
                   dtype_str(t.scalar_type()), " but ", ref_name, " has dtype ",
                   dtype_str(ref.scalar_type()));
  TORCH_CHECK_VALUE(t.device().type() == ref.device().type(), "fastpar.", op, ": ", name,
                    " is on device ", device_str(t), " but ", ref_name, " is on device ", device_str(ref),
                    "; all tensors must be CPU tensors or all CUDA tensors");
  TORCH_CHECK_VALUE(t.is_contiguous(), "fastpar.", op, ": ", name,
                    " must be contiguous, but it has sizes ", t.sizes(), " and strides ", t.strides(),
                    " (call .contiguous() first)");
}

void check_numel(const char* op, const std::string& name, const at::Tensor& t, int64_t expected,
                 const std::string& why) {
  TORCH_CHECK_VALUE(t.numel() == expected, "fastpar.", op, ": ", name, " has ", t.numel(),
                    " elements but ", expected, " were expected (", why, ")");
}

// Two list entries whose bytes overlap: for a list the op writes, the result
// would depend on which entry is written last (and an in-place allreduce would
// read its own partial output), so such lists are refused. Entries on different
// devices never overlap; one device (or "cpu") may appear any number of times.
namespace {
// Whether `a` and `b` share a byte (on one device; empty tensors share none).
bool share_memory(const at::Tensor& a, const at::Tensor& b) {
  const int64_t ba = int64_t(a.nbytes()), bb = int64_t(b.nbytes());
  if (ba == 0 || bb == 0 || a.device() != b.device()) return false;
  const auto* pa = static_cast<const char*>(a.const_data_ptr());
  const auto* pb = static_cast<const char*>(b.const_data_ptr());
  return pa < pb + bb && pb < pa + ba;
}
}  // namespace

void check_no_overlap(const char* op, const char* arg, const at::TensorList& ts) {
  for (size_t i = 1; i < ts.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      TORCH_CHECK_VALUE(!share_memory(ts[i], ts[j]), "fastpar.", op, ": ", indexed(arg, i), " overlaps ",
                        indexed(arg, j), " in memory (both on device ", device_str(ts[i]), "); every entry of ", arg,
                        " must be its own buffer (the op writes them)");
    }
  }
}

void check_output_against_inputs(const char* op, const std::string& name, const at::Tensor& out,
                                 const at::TensorList& inputs, int64_t slice) {
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!share_memory(out, inputs[k])) continue;
    const auto offset = static_cast<const char*>(out.const_data_ptr()) -
                        static_cast<const char*>(inputs[k].const_data_ptr());
    const int64_t received = slice * int64_t(out.nbytes());
    TORCH_CHECK_VALUE(offset == received, "fastpar.", op, ": ", name, " overlaps ", indexed("inputs", k),
                      " in memory at its byte ", int64_t(offset), ", but may share only the elements it receives (byte ",
                      received, "): the op would read elements it has already written");
  }
}

void check_tensor_list(const char* op, const char* arg, const at::TensorList& ts, bool same_numel) {
  TORCH_CHECK_VALUE(!ts.empty(), "fastpar.", op, ": expected a non-empty list of tensors for argument '",
                    arg, "', got an empty list");
  // The common case (every entry fine) builds no strings: these checks run on
  // every call, and a small call on one GPU does little else.
  if (!maybe_dtype(ts[0].scalar_type())) to_dtype(op, indexed(arg, 0), ts[0].scalar_type());
  const at::ScalarType dtype0 = ts[0].defined() ? ts[0].scalar_type() : at::ScalarType::Undefined;
  const int64_t numel0 = ts[0].defined() ? ts[0].numel() : 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    const at::Tensor& t = ts[i];
    if (t.defined() && t.scalar_type() == dtype0 && t.device().type() == ts[0].device().type() &&
        t.is_contiguous() && (!same_numel || t.numel() == numel0))
      continue;
    const std::string first = indexed(arg, 0);
    const std::string name = indexed(arg, i);
    TORCH_CHECK_VALUE(t.defined(), "fastpar.", op, ": ", name, " is an undefined tensor");
    check_like(op, name, t, first, ts[0]);
    TORCH_CHECK_VALUE(!same_numel || t.numel() == numel0, "fastpar.", op, ": ", name, " has ", t.numel(),
                      " elements (shape ", t.sizes(), ") but ", first, " has ", numel0, " elements (shape ",
                      ts[0].sizes(), ")");
  }
}

void check_like_any_device(const char* op, const std::string& name, const at::Tensor& t,
                           const std::string& ref_name, const at::Tensor& ref) {
  TORCH_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), "fastpar.", op, ": ", name, " has dtype ",
                   dtype_str(t.scalar_type()), " but ", ref_name, " has dtype ",
                   dtype_str(ref.scalar_type()));
  TORCH_CHECK_VALUE(t.is_contiguous(), "fastpar.", op, ": ", name,
                    " must be contiguous, but it has sizes ", t.sizes(), " and strides ", t.strides(),
                    " (call .contiguous() first)");
}

ReduceOp check_allreduce_args(at::TensorList tensors, int64_t op, const std::string& algorithm) {
  check_tensor_list("allreduce", "tensors", tensors);
  const ReduceOp rop = to_reduce_op("allreduce", op);
  to_dtype("allreduce", "tensors[0]", tensors[0].scalar_type());  // every op reduces every dtype it has
  TORCH_CHECK_VALUE(algorithm == "auto" || algorithm == "direct" || algorithm == "ring",
                    "fastpar.allreduce: algorithm is '", algorithm, "' but must be 'auto', 'direct' or 'ring'");
  check_no_overlap("allreduce", "tensors", tensors);
  return rop;
}

ReduceOp check_reduce_args(at::TensorList inputs, const at::Tensor& output, int64_t op) {
  check_tensor_list("reduce", "inputs", inputs);
  check_like("reduce", "output", output, "inputs[0]", inputs[0]);
  check_numel("reduce", "output", output, inputs[0].numel(), "the numel of inputs[0]");
  const ReduceOp rop = to_reduce_op("reduce", op);
  to_dtype("reduce", "inputs[0]", inputs[0].scalar_type());  // every op reduces every dtype it has
  check_output_against_inputs("reduce", "output", output, inputs, 0);
  return rop;
}

ReduceOp check_reduce_scatter_args(at::TensorList inputs, at::TensorList outputs, int64_t op) {
  check_tensor_list("reduce_scatter", "inputs", inputs);
  check_tensor_list("reduce_scatter", "outputs", outputs);
  const int64_t n = int64_t(inputs.size());
  TORCH_CHECK_VALUE(int64_t(outputs.size()) == n, "fastpar.reduce_scatter: outputs has ", outputs.size(),
                    " tensors but inputs has ", n);
  check_like("reduce_scatter", "outputs[0]", outputs[0], "inputs[0]", inputs[0]);
  check_numel("reduce_scatter", "inputs[0]", inputs[0], n * outputs[0].numel(),
              "len(inputs) * outputs[0].numel()");
  const ReduceOp rop = to_reduce_op("reduce_scatter", op);
  to_dtype("reduce_scatter", "inputs[0]", inputs[0].scalar_type());  // every op reduces every dtype it has
  check_no_overlap("reduce_scatter", "outputs", outputs);
  for (int64_t i = 0; i < n; ++i)
    check_output_against_inputs("reduce_scatter", indexed("outputs", size_t(i)), outputs[size_t(i)], inputs, i);
  return rop;
}

void check_allgather_args(at::TensorList inputs, at::TensorList outputs) {
  check_tensor_list("allgather", "inputs", inputs);
  check_tensor_list("allgather", "outputs", outputs);
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "fastpar.allgather: outputs has ", outputs.size(),
                    " tensors but inputs has ", inputs.size());
  check_like("allgather", "outputs[0]", outputs[0], "inputs[0]", inputs[0]);
  check_numel("allgather", "outputs[0]", outputs[0], int64_t(inputs.size()) * inputs[0].numel(),
              "len(inputs) * inputs[0].numel()");
  check_no_overlap("allgather", "outputs", outputs);
}

void check_copy_many_args(at::TensorList srcs, at::TensorList dsts) {
  TORCH_CHECK_VALUE(srcs.size() == dsts.size(), "fastpar.copy_many_: dsts has ", dsts.size(),
                    " tensors but srcs has ", srcs.size());
  for (size_t i = 0; i < srcs.size(); ++i) {
    const std::string name = indexed("dsts", i);
    TORCH_CHECK_VALUE(dsts[i].sizes() == srcs[i].sizes(), "fastpar.copy_many_: ", name, " has shape ",
                      dsts[i].sizes(), " but ", indexed("srcs", i), " has shape ", srcs[i].sizes());
    TORCH_CHECK_TYPE(dsts[i].scalar_type() == srcs[i].scalar_type(), "fastpar.copy_many_: ", name,
                     " has dtype ", dtype_str(dsts[i].scalar_type()), " but ", indexed("srcs", i),
                     " has dtype ", dtype_str(srcs[i].scalar_type()), " (copies do not convert)");
  }
}

}  // namespace ops
}  // namespace fastpar
