// CPU implementations of the torch.ops.fastpar primitives: each list entry is a
// separate buffer in this process (one per "rank"), the cpu_local transport
// moves the bytes and kernels/cpu_reduce.h does the math.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../transport/cpu_local/cpu_local.h"
#include "../transport/cpu_local/parallel_copy.h"
#include "checks.h"
#include "tuning.h"

namespace fastpar {
namespace ops {
namespace {

const cpu_local::ParallelFor& torch_parallel_for() {
  static const cpu_local::ParallelFor pf = [](int64_t b, int64_t e, int64_t grain,
                                              const std::function<void(int64_t, int64_t)>& f) {
    at::parallel_for(b, e, grain, f);
  };
  return pf;
}

template <typename T>
std::vector<const T*> const_ptrs(at::TensorList ts, int64_t offset = 0) {
  std::vector<const T*> v;
  for (const auto& t : ts) v.push_back(static_cast<const T*>(t.data_ptr()) + offset);
  return v;
}

template <typename T>
std::vector<T*> mut_ptrs(at::TensorList ts) {
  std::vector<T*> v;
  for (const auto& t : ts) v.push_back(static_cast<T*>(t.data_ptr()));
  return v;
}

void allreduce_cpu(at::TensorList tensors, int64_t op, c10::string_view algorithm) {
  check_tensor_list("allreduce", "tensors", tensors, /*distinct_cuda=*/true);
  const ReduceOp rop = to_reduce_op("allreduce", op);
  check_op_dtype("allreduce", rop, "tensors[0]", tensors[0]);
  const std::string algo(algorithm);
  TORCH_CHECK_VALUE(algo == "auto" || algo == "direct" || algo == "ring",
                    "fastpar.allreduce: algorithm is '", algo, "' but must be 'auto', 'direct' or 'ring'");
  const int n = int(tensors.size());
  const int64_t count = tensors[0].numel();
  const DType dt = to_dtype("allreduce", "tensors[0]", tensors[0].scalar_type());
  FASTPAR_DISPATCH_DTYPE(dt, [&] {
    FASTPAR_DISPATCH_OP(rop, [&] {
      if constexpr (kOp == ReduceOp::AVG && !is_floating<scalar_t>()) {
        TORCH_INTERNAL_ASSERT(false, "AVG on an integer dtype passed the checks");
      } else if (algo == "ring") {
        const int64_t seg = std::max<int64_t>(1, tuning().ring_segment_bytes / int64_t(sizeof(scalar_t)));
        cpu_local::allreduce_ring<scalar_t, kOp>(torch_parallel_for(), mut_ptrs<scalar_t>(tensors),
                                                  count, seg, 64 / int64_t(sizeof(scalar_t)));
      } else {
        // One pass: the best a single address space can do (k reads, k writes).
        auto data = mut_ptrs<scalar_t>(tensors);
        std::vector<const scalar_t*> srcs(data.begin(), data.end());
        cpu_local::reduce_direct<scalar_t, kOp>(torch_parallel_for(), srcs, data, count, n);
      }
    });
  });
}

void reduce_cpu(at::TensorList inputs, const at::Tensor& output, int64_t op) {
  check_tensor_list("reduce", "inputs", inputs, /*distinct_cuda=*/true);
  check_like("reduce", "output", output, "inputs[0]", inputs[0]);
  check_numel("reduce", "output", output, inputs[0].numel(), "the numel of inputs[0]");
  const ReduceOp rop = to_reduce_op("reduce", op);
  check_op_dtype("reduce", rop, "inputs[0]", inputs[0]);
  const DType dt = to_dtype("reduce", "inputs[0]", inputs[0].scalar_type());
  FASTPAR_DISPATCH_DTYPE(dt, [&] {
    FASTPAR_DISPATCH_OP(rop, [&] {
      if constexpr (kOp == ReduceOp::AVG && !is_floating<scalar_t>()) {
        TORCH_INTERNAL_ASSERT(false, "AVG on an integer dtype passed the checks");
      } else {
        cpu_local::reduce_direct<scalar_t, kOp>(torch_parallel_for(), const_ptrs<scalar_t>(inputs),
                                                 {static_cast<scalar_t*>(output.data_ptr())},
                                                 inputs[0].numel(), int(inputs.size()));
      }
    });
  });
}

void reduce_scatter_cpu(at::TensorList inputs, at::TensorList outputs, int64_t op) {
  check_tensor_list("reduce_scatter", "inputs", inputs, /*distinct_cuda=*/true);
  check_tensor_list("reduce_scatter", "outputs", outputs, /*distinct_cuda=*/true);
  const int64_t n = int64_t(inputs.size());
  TORCH_CHECK_VALUE(int64_t(outputs.size()) == n, "fastpar.reduce_scatter: outputs has ", outputs.size(),
                    " tensors but inputs has ", n);
  check_like("reduce_scatter", "outputs[0]", outputs[0], "inputs[0]", inputs[0]);
  const int64_t m = outputs[0].numel();
  check_numel("reduce_scatter", "inputs[0]", inputs[0], n * m, "len(inputs) * outputs[0].numel()");
  const ReduceOp rop = to_reduce_op("reduce_scatter", op);
  check_op_dtype("reduce_scatter", rop, "inputs[0]", inputs[0]);
  const DType dt = to_dtype("reduce_scatter", "inputs[0]", inputs[0].scalar_type());
  FASTPAR_DISPATCH_DTYPE(dt, [&] {
    FASTPAR_DISPATCH_OP(rop, [&] {
      if constexpr (kOp == ReduceOp::AVG && !is_floating<scalar_t>()) {
        TORCH_INTERNAL_ASSERT(false, "AVG on an integer dtype passed the checks");
      } else {
        for (int64_t i = 0; i < n; ++i) {
          cpu_local::reduce_direct<scalar_t, kOp>(torch_parallel_for(), const_ptrs<scalar_t>(inputs, i * m),
                                                   {static_cast<scalar_t*>(outputs[i].data_ptr())}, m,
                                                   int(n));
        }
      }
    });
  });
}

void allgather_cpu(at::TensorList inputs, at::TensorList outputs) {
  check_tensor_list("allgather", "inputs", inputs, /*distinct_cuda=*/true);
  check_tensor_list("allgather", "outputs", outputs, /*distinct_cuda=*/true);
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "fastpar.allgather: outputs has ", outputs.size(),
                    " tensors but inputs has ", inputs.size());
  check_like("allgather", "outputs[0]", outputs[0], "inputs[0]", inputs[0]);
  const int64_t bytes = inputs[0].numel() * inputs[0].element_size();
  check_numel("allgather", "outputs[0]", outputs[0], int64_t(inputs.size()) * inputs[0].numel(),
              "len(inputs) * inputs[0].numel()");
  std::vector<cpu_local::CopyJob> jobs;
  for (const auto& out : outputs)
    for (size_t i = 0; i < inputs.size(); ++i)
      jobs.push_back({static_cast<char*>(out.data_ptr()) + int64_t(i) * bytes, inputs[i].data_ptr(), bytes});
  cpu_local::parallel_copy(torch_parallel_for(), jobs);
}

void broadcast_cpu(const at::Tensor& src, at::TensorList outputs) {
  check_tensor_list("broadcast", "outputs", outputs, /*distinct_cuda=*/true);
  check_like("broadcast", "tensor", src, "outputs[0]", outputs[0]);
  check_numel("broadcast", "outputs[0]", outputs[0], src.numel(), "the numel of tensor");
  std::vector<cpu_local::CopyJob> jobs;
  for (const auto& out : outputs) jobs.push_back({out.data_ptr(), src.data_ptr(), src.nbytes()});
  cpu_local::parallel_copy(torch_parallel_for(), jobs);
}

void copy_many_cpu(at::TensorList srcs, at::TensorList dsts) {
  TORCH_CHECK_VALUE(srcs.size() == dsts.size(), "fastpar.copy_many_: dsts has ", dsts.size(),
                    " tensors but srcs has ", srcs.size());
  std::vector<cpu_local::CopyJob> jobs;
  for (size_t i = 0; i < srcs.size(); ++i) {
    const std::string name = indexed("dsts", i);
    TORCH_CHECK_VALUE(dsts[i].sizes() == srcs[i].sizes(), "fastpar.copy_many_: ", name, " has shape ",
                      dsts[i].sizes(), " but ", indexed("srcs", i), " has shape ", srcs[i].sizes());
    TORCH_CHECK_TYPE(dsts[i].scalar_type() == srcs[i].scalar_type(), "fastpar.copy_many_: ", name,
                     " has dtype ", dsts[i].scalar_type(), " but ", indexed("srcs", i), " has dtype ",
                     srcs[i].scalar_type(), " (copies do not convert)");
  }
  for (size_t i = 0; i < srcs.size(); ++i) {
    if (srcs[i].is_contiguous() && dsts[i].is_contiguous()) {
      jobs.push_back({dsts[i].data_ptr(), srcs[i].data_ptr(), srcs[i].nbytes()});
    } else {
      dsts[i].copy_(srcs[i]);  // strided views (gather along dim != 0): torch's copy kernel
    }
  }
  cpu_local::parallel_copy(torch_parallel_for(), jobs);
}

}  // namespace

TORCH_LIBRARY_IMPL(fastpar, CPU, m) {
  m.impl("allreduce_", &allreduce_cpu);
  m.impl("reduce_", &reduce_cpu);
  m.impl("reduce_scatter_", &reduce_scatter_cpu);
  m.impl("allgather_", &allgather_cpu);
  m.impl("broadcast_", &broadcast_cpu);
  m.impl("copy_many_", &copy_many_cpu);
}

}  // namespace ops
}  // namespace fastpar
