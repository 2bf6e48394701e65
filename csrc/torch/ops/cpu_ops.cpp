// CPU implementations of the torch.ops.fastpar primitives: each list entry is a
// separate buffer in this process (one per "rank"), the cpu_local transport
// moves the bytes and core/kernels/cpu_reduce.h does the math.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../../core/executors/cpu_local/cpu_local.h"
#include "../../core/executors/cpu_local/parallel_copy.h"
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
  const std::string algo(algorithm);
  const ReduceOp rop = check_allreduce_args(tensors, op, algo);
  const int n = int(tensors.size());
  const int64_t count = tensors[0].numel();
  const DType dt = to_dtype("allreduce", "tensors[0]", tensors[0].scalar_type());
  FASTPAR_DISPATCH_DTYPE(dt, [&] {
    FASTPAR_DISPATCH_OP(rop, [&] {
      if (algo == "ring") {
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
  const ReduceOp rop = check_reduce_args(inputs, output, op);
  const DType dt = to_dtype("reduce", "inputs[0]", inputs[0].scalar_type());
  FASTPAR_DISPATCH_DTYPE(dt, [&] {
    FASTPAR_DISPATCH_OP(rop, [&] {
      cpu_local::reduce_direct<scalar_t, kOp>(torch_parallel_for(), const_ptrs<scalar_t>(inputs),
                                               {static_cast<scalar_t*>(output.data_ptr())},
                                               inputs[0].numel(), int(inputs.size()));
    });
  });
}

void reduce_scatter_cpu(at::TensorList inputs, at::TensorList outputs, int64_t op) {
  const ReduceOp rop = check_reduce_scatter_args(inputs, outputs, op);
  const int64_t n = int64_t(inputs.size());
  const int64_t m = outputs[0].numel();
  const DType dt = to_dtype("reduce_scatter", "inputs[0]", inputs[0].scalar_type());
  FASTPAR_DISPATCH_DTYPE(dt, [&] {
    FASTPAR_DISPATCH_OP(rop, [&] {
      for (int64_t i = 0; i < n; ++i) {
        cpu_local::reduce_direct<scalar_t, kOp>(torch_parallel_for(), const_ptrs<scalar_t>(inputs, i * m),
                                                 {static_cast<scalar_t*>(outputs[i].data_ptr())}, m, int(n));
      }
    });
  });
}

void allgather_cpu(at::TensorList inputs, at::TensorList outputs) {
  check_allgather_args(inputs, outputs);
  const int64_t bytes = inputs[0].numel() * inputs[0].element_size();
  std::vector<cpu_local::CopyJob> jobs;
  for (const auto& out : outputs)
    for (size_t i = 0; i < inputs.size(); ++i)
      jobs.push_back({static_cast<char*>(out.data_ptr()) + int64_t(i) * bytes, inputs[i].data_ptr(), bytes});
  cpu_local::parallel_copy(torch_parallel_for(), jobs);
}

void broadcast_cpu(const at::Tensor& src, at::TensorList outputs) {
  check_tensor_list("broadcast", "outputs", outputs);
  check_like("broadcast", "tensor", src, "outputs[0]", outputs[0]);
  check_numel("broadcast", "outputs[0]", outputs[0], src.numel(), "the numel of tensor");
  check_no_overlap("broadcast", "outputs", outputs);
  std::vector<cpu_local::CopyJob> jobs;
  for (const auto& out : outputs) jobs.push_back({out.data_ptr(), src.data_ptr(), static_cast<int64_t>(src.nbytes())});
  cpu_local::parallel_copy(torch_parallel_for(), jobs);
}

void copy_many_cpu(at::TensorList srcs, at::TensorList dsts) {
  check_copy_many_args(srcs, dsts);
  std::vector<cpu_local::CopyJob> jobs;
  for (size_t i = 0; i < srcs.size(); ++i) {
    if (srcs[i].is_contiguous() && dsts[i].is_contiguous()) {
      jobs.push_back({dsts[i].data_ptr(), srcs[i].data_ptr(), static_cast<int64_t>(srcs[i].nbytes())});
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
