// CudaBackend's collectives (cuda_backend.h): each checks its arguments,
// asks the route (torch/distributed/route.h) and enqueues the IPC schedule
// (transport/cuda_ipc) on the caller's current stream, or hands the call to
// the fallback (NCCL).
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>

#include "../ops/checks.h"
#include "../../core/executors/cuda_ipc/ipc_allreduce.h"
#include "../../core/executors/cuda_ipc/ipc_collectives.h"
#include "route.h"
#include "c10d_compat.h"
#include "call_timeout.h"
#include "cuda_backend.h"
#include "cuda_backend_args.h"

namespace fastpar {
namespace distributed {

using namespace cuda_args;

// ---------------------------------------------------------------- IPC collectives

c10::intrusive_ptr<c10d::Work> CudaBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::AllreduceOptions& opts) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "fastpar.all_reduce: expected exactly one tensor in tensors (one per "
                    "process), got ", tensors.size());
  at::Tensor& t = tensors[0];
  check_cuda("all_reduce", "tensors[0]", t);
  std::unique_lock<std::mutex> g(mu_);
  cuda_ipc::RouteQuery q = query_for("all_reduce", t);
  const std::optional<DType> dt = maybe_dtype(t.scalar_type());
  q.dtype_supported = dt.has_value();
  q.op_supported = reduces(dt, opts.reduceOp);
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("all_reduce", q);
    g.unlock();
    return fallback_->allreduce(tensors, opts);
  }
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  c10::cuda::CUDAGuard guard(t.device());
  const c10::cuda::CUDAStream stream = begin_ipc("all_reduce", t, timeout, /*capturable=*/true);
  cuda_ipc::IpcComm& c = link_->ep->comm();
  if (capturing(stream)) {
    // The kernel a replay can repeat (fused_one_shot.h, "the all_reduce a
    // CUDA graph can capture"): its own flags and slot, no host counter.
    TORCH_CHECK_VALUE(q.nbytes <= slot_bytes_, "fastpar.all_reduce: a CUDA graph can capture an all_reduce over "
                      "CUDA IPC of at most FASTPAR_CUDA_IPC_SLOT_BYTES = ", slot_bytes_, " bytes, but tensors[0] has ",
                      q.nbytes, " bytes");
    if (t.numel() > 0)
      C10_CUDA_CHECK(cuda_ipc::allreduce_graphed(c, *dt, ReduceOp(int(opts.reduceOp.op_)), t.const_data_ptr(),
                                                 t.data_ptr(), t.numel(), stream));
  } else if (t.numel() > 0 && getSize() > 1) {
    const ReduceOp rop = ReduceOp(int(opts.reduceOp.op_));
    const int64_t reg = registered_offset(t);
    if (cuda_ipc::prefer_one_shot(q.nbytes, c)) {
      C10_CUDA_CHECK(cuda_ipc::allreduce_one_shot(c, *dt, rop, t.const_data_ptr(), t.data_ptr(), t.numel(), stream));
    } else if (reg >= 0) {
      // A registered tensor (registered_empty): no copy-in. Every rank's must
      // be; the offset in the descriptor makes a mix fail on every rank.
      C10_CUDA_CHECK(cuda_ipc::allreduce_registered(c, *dt, rop, reg, t.numel(), stream));
    } else {
      C10_CUDA_CHECK(cuda_ipc::allreduce_two_shot(c, *dt, rop, t.const_data_ptr(), t.data_ptr(), t.numel(), stream));
    }
  }
  return ipc_work(c10d::OpType::ALLREDUCE, "all_reduce", tensors, stream, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                      const c10d::BroadcastOptions& opts) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "fastpar.broadcast: expected exactly one tensor in tensors (one per "
                    "process), got ", tensors.size());
  at::Tensor& t = tensors[0];
  check_cuda("broadcast", "tensors[0]", t);
  check_root("broadcast", opts.rootRank, getSize());
  std::unique_lock<std::mutex> g(mu_);
  const cuda_ipc::RouteQuery q = query_for("broadcast", t);
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("broadcast", q);
    g.unlock();
    return fallback_->broadcast(tensors, opts);
  }
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  c10::cuda::CUDAGuard guard(t.device());
  const c10::cuda::CUDAStream stream = begin_ipc("broadcast", t, timeout);
  // Every call runs its phases, even with one rank or no bytes: the descriptor
  // check is what catches a desynced peer.
  C10_CUDA_CHECK(cuda_ipc::broadcast_ipc(link_->ep->comm(), descriptor_dtype(t), t.numel(), t.data_ptr(),
                                         int64_t(t.nbytes()), int(opts.rootRank), stream));
  return ipc_work(c10d::OpType::BROADCAST, "broadcast", tensors, stream, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::reduce(std::vector<at::Tensor>& tensors,
                                                   const c10d::ReduceOptions& opts) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "fastpar.reduce: expected exactly one tensor in tensors (one per "
                    "process), got ", tensors.size());
  at::Tensor& t = tensors[0];
  check_cuda("reduce", "tensors[0]", t);
  check_root("reduce", opts.rootRank, getSize());
  std::unique_lock<std::mutex> g(mu_);
  cuda_ipc::RouteQuery q = query_for("reduce", t);
  const std::optional<DType> dt = maybe_dtype(t.scalar_type());
  q.dtype_supported = dt.has_value();
  q.op_supported = reduces(dt, opts.reduceOp);
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("reduce", q);
    g.unlock();
    return fallback_->reduce(tensors, opts);
  }
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  c10::cuda::CUDAGuard guard(t.device());
  const c10::cuda::CUDAStream stream = begin_ipc("reduce", t, timeout);
  C10_CUDA_CHECK(cuda_ipc::reduce_ipc(link_->ep->comm(), *dt, ReduceOp(int(opts.reduceOp.op_)), t.const_data_ptr(),
                                      t.data_ptr(), t.numel(), int(opts.rootRank), stream));
  return ipc_work(c10d::OpType::REDUCE, "reduce", tensors, stream, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(inputs.size() == 1 && outputs.size() == 1, "fastpar.all_gather: expected one input tensor and "
                    "one output list (one per process), got ", inputs.size(), " and ", outputs.size());
  const at::Tensor& in = inputs[0];
  check_cuda("all_gather", "input_tensor", in);
  TORCH_CHECK_VALUE(int64_t(outputs[0].size()) == getSize(), "fastpar.all_gather: tensor_list has ",
                    outputs[0].size(), " tensors but the group has ", getSize(), " ranks");
  bool same_device = true;
  for (size_t q = 0; q < outputs[0].size(); ++q) {
    const at::Tensor& o = outputs[0][q];
    check_like("all_gather", "tensor_list[" + std::to_string(q) + "]", o, in, "input_tensor", in.numel());
    same_device = same_device && o.device() == in.device();
  }
  std::unique_lock<std::mutex> g(mu_);
  // Routed by the input (what torch makes equal on every rank); outputs that
  // are not contiguous are staged.
  cuda_ipc::RouteQuery q = query_for("all_gather", in);
  q.on_rank_device = q.on_rank_device && same_device;
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("all_gather", q);
    g.unlock();
    return fallback_->allgather(outputs, inputs, opts);
  }
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  c10::cuda::CUDAGuard guard(in.device());
  const c10::cuda::CUDAStream stream = begin_ipc("all_gather", in, timeout);
  StagedOutputs staged;
  void* outs[cuda_ipc::kMaxIpcRanks];
  for (int r = 0; r < getSize(); ++r) outs[r] = staged.add(outputs[0][size_t(r)]);
  C10_CUDA_CHECK(cuda_ipc::allgather_ipc(link_->ep->comm(), descriptor_dtype(in), in.numel(),
                                         in.const_data_ptr(), outs, int64_t(in.nbytes()), stream));
  staged.finish();
  return ipc_work(c10d::OpType::ALLGATHER, "all_gather", outputs[0], stream, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                            const c10d::AllgatherOptions& opts) {
  check_cuda("all_gather_into_tensor", "input_tensor", input);
  check_like("all_gather_into_tensor", "output_tensor", output, input, "input_tensor", input.numel() * getSize());
  std::unique_lock<std::mutex> g(mu_);
  cuda_ipc::RouteQuery q = query_for("all_gather_into_tensor", input);
  q.contiguous = input.is_contiguous() && output.is_contiguous();
  q.on_rank_device = q.on_rank_device && output.device() == input.device();
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("all_gather_into_tensor", q);
    g.unlock();
    return fallback_->_allgather_base(output, input, opts);
  }
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  c10::cuda::CUDAGuard guard(input.device());
  const c10::cuda::CUDAStream stream = begin_ipc("all_gather_into_tensor", input, timeout);
  void* outs[cuda_ipc::kMaxIpcRanks];
  for (int r = 0; r < getSize(); ++r) outs[r] = static_cast<char*>(output.data_ptr()) + int64_t(input.nbytes()) * r;
  C10_CUDA_CHECK(cuda_ipc::allgather_ipc(link_->ep->comm(), descriptor_dtype(input), input.numel(),
                                         input.const_data_ptr(), outs, int64_t(input.nbytes()), stream));
  return ipc_work(c10d::OpType::_ALLGATHER_BASE, "all_gather_into_tensor", {output}, stream, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                            std::vector<at::Tensor>& inputs,
                                                                            const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "fastpar.all_gather_into_tensor_coalesced: ", outputs.size(),
                    " outputs but ", inputs.size(), " inputs");
  if (inputs.empty()) return fallback_->allgather_into_tensor_coalesced(outputs, inputs, opts);
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_cuda("all_gather_into_tensor_coalesced", ("inputs[" + std::to_string(i) + "]").c_str(), inputs[i]);
    check_like("all_gather_into_tensor_coalesced", "outputs[" + std::to_string(i) + "]", outputs[i], inputs[i],
               ("inputs[" + std::to_string(i) + "]").c_str(), inputs[i].numel() * getSize());
  }
  std::unique_lock<std::mutex> g(mu_);
  // One route for the whole call: every entry must qualify (the largest sets the size).
  cuda_ipc::RouteQuery q = query_for("all_gather_into_tensor_coalesced", inputs[0]);
  for (size_t i = 0; i < inputs.size(); ++i) {
    q.nbytes = std::max<int64_t>(q.nbytes, int64_t(inputs[i].nbytes()));
    q.contiguous = q.contiguous && inputs[i].is_contiguous() && outputs[i].is_contiguous();
    q.on_rank_device = q.on_rank_device && inputs[i].get_device() == device_ && outputs[i].get_device() == device_;
  }
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("all_gather_into_tensor_coalesced", q);
    g.unlock();
    return fallback_->allgather_into_tensor_coalesced(outputs, inputs, opts);
  }
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  c10::cuda::CUDAGuard guard(inputs[0].device());
  const c10::cuda::CUDAStream stream = begin_ipc("all_gather_into_tensor_coalesced", inputs[0], timeout);
  for (size_t i = 0; i < inputs.size(); ++i) {
    void* outs[cuda_ipc::kMaxIpcRanks];
    const int64_t b = int64_t(inputs[i].nbytes());
    for (int r = 0; r < getSize(); ++r) outs[r] = static_cast<char*>(outputs[i].data_ptr()) + b * r;
    C10_CUDA_CHECK(cuda_ipc::allgather_ipc(link_->ep->comm(), descriptor_dtype(inputs[i]), inputs[i].numel(),
                                           inputs[i].const_data_ptr(), outs, b, stream));
  }
  return ipc_work(kAllgatherIntoTensorCoalesced, "all_gather_into_tensor_coalesced", outputs, stream, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                           std::vector<std::vector<at::Tensor>>& inputs,
                                                           const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(inputs.size() == 1 && outputs.size() == 1, "fastpar.reduce_scatter: expected one output tensor "
                    "and one input list (one per process), got ", outputs.size(), " and ", inputs.size());
  at::Tensor& out = outputs[0];
  check_cuda("reduce_scatter", "output", out);
  TORCH_CHECK_VALUE(int64_t(inputs[0].size()) == getSize(), "fastpar.reduce_scatter: input_list has ",
                    inputs[0].size(), " tensors but the group has ", getSize(), " ranks");
  bool contiguous = out.is_contiguous(), same_device = true;
  for (size_t q = 0; q < inputs[0].size(); ++q) {
    const at::Tensor& x = inputs[0][q];
    check_like("reduce_scatter", "input_list[" + std::to_string(q) + "]", x, out, "output", out.numel());
    contiguous = contiguous && x.is_contiguous();
    same_device = same_device && x.device() == out.device();
  }
  std::unique_lock<std::mutex> g(mu_);
  cuda_ipc::RouteQuery q = query_for("reduce_scatter", out);
  const std::optional<DType> dt = maybe_dtype(out.scalar_type());
  q.dtype_supported = dt.has_value();
  q.op_supported = reduces(dt, opts.reduceOp);
  q.contiguous = contiguous;
  q.on_rank_device = q.on_rank_device && same_device;
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("reduce_scatter", q);
    g.unlock();
    return fallback_->reduce_scatter(outputs, inputs, opts);
  }
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  c10::cuda::CUDAGuard guard(out.device());
  const c10::cuda::CUDAStream stream = begin_ipc("reduce_scatter", out, timeout);
  const void* ins[cuda_ipc::kMaxIpcRanks];
  for (int r = 0; r < getSize(); ++r) ins[r] = inputs[0][size_t(r)].const_data_ptr();
  C10_CUDA_CHECK(cuda_ipc::reduce_scatter_ipc(link_->ep->comm(), *dt, ReduceOp(int(opts.reduceOp.op_)), ins,
                                              out.data_ptr(), out.numel(), stream));
  return ipc_work(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", outputs, stream, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                 const c10d::ReduceScatterOptions& opts) {
  check_cuda("reduce_scatter_tensor", "output", output);
  check_like("reduce_scatter_tensor", "input", input, output, "output", output.numel() * getSize());
  std::unique_lock<std::mutex> g(mu_);
  cuda_ipc::RouteQuery q = query_for("reduce_scatter_tensor", output);
  const std::optional<DType> dt = maybe_dtype(output.scalar_type());
  q.dtype_supported = dt.has_value();
  q.op_supported = reduces(dt, opts.reduceOp);
  q.contiguous = input.is_contiguous() && output.is_contiguous();
  q.on_rank_device = q.on_rank_device && input.device() == output.device();
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("reduce_scatter_tensor", q);
    g.unlock();
    return fallback_->_reduce_scatter_base(output, input, opts);
  }
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  c10::cuda::CUDAGuard guard(output.device());
  const c10::cuda::CUDAStream stream = begin_ipc("reduce_scatter_tensor", output, timeout);
  const void* ins[cuda_ipc::kMaxIpcRanks];
  for (int r = 0; r < getSize(); ++r)
    ins[r] = static_cast<const char*>(input.const_data_ptr()) + int64_t(output.nbytes()) * r;
  C10_CUDA_CHECK(cuda_ipc::reduce_scatter_ipc(link_->ep->comm(), *dt, ReduceOp(int(opts.reduceOp.op_)), ins,
                                              output.data_ptr(), output.numel(), stream));
  return ipc_work(c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", {output}, stream, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                            std::vector<at::Tensor>& inputs,
                                                                            const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "fastpar.reduce_scatter_tensor_coalesced: ", outputs.size(),
                    " outputs but ", inputs.size(), " inputs");
  if (inputs.empty()) return fallback_->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
  for (size_t i = 0; i < outputs.size(); ++i) {
    check_cuda("reduce_scatter_tensor_coalesced", ("outputs[" + std::to_string(i) + "]").c_str(), outputs[i]);
    check_like("reduce_scatter_tensor_coalesced", "inputs[" + std::to_string(i) + "]", inputs[i], outputs[i],
               ("outputs[" + std::to_string(i) + "]").c_str(), outputs[i].numel() * getSize());
  }
  std::unique_lock<std::mutex> g(mu_);
  cuda_ipc::RouteQuery q = query_for("reduce_scatter_tensor_coalesced", outputs[0]);
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::optional<DType> dt = maybe_dtype(outputs[i].scalar_type());
    q.dtype_supported = q.dtype_supported && dt.has_value();
    q.op_supported = q.op_supported && reduces(dt, opts.reduceOp);
    q.nbytes = std::max<int64_t>(q.nbytes, int64_t(outputs[i].nbytes()));
    q.contiguous = q.contiguous && inputs[i].is_contiguous() && outputs[i].is_contiguous();
    q.on_rank_device = q.on_rank_device && inputs[i].get_device() == device_ && outputs[i].get_device() == device_;
  }
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("reduce_scatter_tensor_coalesced", q);
    g.unlock();
    return fallback_->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
  }
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  c10::cuda::CUDAGuard guard(outputs[0].device());
  const c10::cuda::CUDAStream stream = begin_ipc("reduce_scatter_tensor_coalesced", outputs[0], timeout);
  for (size_t i = 0; i < outputs.size(); ++i) {
    const void* ins[cuda_ipc::kMaxIpcRanks];
    for (int r = 0; r < getSize(); ++r)
      ins[r] = static_cast<const char*>(inputs[i].const_data_ptr()) + int64_t(outputs[i].nbytes()) * r;
    C10_CUDA_CHECK(cuda_ipc::reduce_scatter_ipc(link_->ep->comm(), *maybe_dtype(outputs[i].scalar_type()),
                                                ReduceOp(int(opts.reduceOp.op_)), ins, outputs[i].data_ptr(),
                                                outputs[i].numel(), stream));
  }
  return ipc_work(kReduceScatterTensorCoalesced, "reduce_scatter_tensor_coalesced", outputs, stream, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                const c10d::AllreduceCoalescedOptions& opts) {
  if (tensors.empty()) return fallback_->allreduce_coalesced(tensors, opts);
  for (size_t i = 0; i < tensors.size(); ++i)
    check_cuda("all_reduce_coalesced", ("tensors[" + std::to_string(i) + "]").c_str(), tensors[i]);
  std::unique_lock<std::mutex> g(mu_);
  cuda_ipc::RouteQuery q = query_for("all_reduce_coalesced", tensors[0]);
  for (const at::Tensor& t : tensors) {
    const std::optional<DType> dt = maybe_dtype(t.scalar_type());
    q.dtype_supported = q.dtype_supported && dt.has_value();
    q.op_supported = q.op_supported && reduces(dt, opts.reduceOp);
    q.nbytes = std::max<int64_t>(q.nbytes, int64_t(t.nbytes()));
    q.contiguous = q.contiguous && t.is_contiguous();
    q.on_rank_device = q.on_rank_device && t.get_device() == device_;
  }
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("all_reduce_coalesced", q);
    g.unlock();
    return fallback_->allreduce_coalesced(tensors, opts);
  }
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  c10::cuda::CUDAGuard guard(tensors[0].device());
  const c10::cuda::CUDAStream stream = begin_ipc("all_reduce_coalesced", tensors[0], timeout);
  cuda_ipc::IpcComm& c = link_->ep->comm();
  const ReduceOp rop = ReduceOp(int(opts.reduceOp.op_));
  for (at::Tensor& t : tensors) {
    if (t.numel() == 0 || getSize() == 1) continue;  // as all_reduce: every rank skips the same entries
    const DType dt = *maybe_dtype(t.scalar_type());
    if (cuda_ipc::prefer_one_shot(int64_t(t.nbytes()), c)) {
      C10_CUDA_CHECK(cuda_ipc::allreduce_one_shot(c, dt, rop, t.const_data_ptr(), t.data_ptr(), t.numel(), stream));
    } else {
      C10_CUDA_CHECK(cuda_ipc::allreduce_two_shot(c, dt, rop, t.const_data_ptr(), t.data_ptr(), t.numel(), stream));
    }
  }
  return ipc_work(c10d::OpType::ALLREDUCE_COALESCED, "all_reduce_coalesced", tensors, stream, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                std::vector<at::Tensor>& inputs,
                                                                const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "fastpar.all_gather_coalesced: ", outputs.size(),
                    " output lists but ", inputs.size(), " inputs");
  if (inputs.empty()) return fallback_->allgather_coalesced(outputs, inputs, opts);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string in_name = "input_tensor_list[" + std::to_string(i) + "]";
    check_cuda("all_gather_coalesced", in_name.c_str(), inputs[i]);
    TORCH_CHECK_VALUE(int64_t(outputs[i].size()) == getSize(), "fastpar.all_gather_coalesced: output_tensor_lists[",
                      i, "] has ", outputs[i].size(), " tensors but the group has ", getSize(), " ranks");
    for (size_t r = 0; r < outputs[i].size(); ++r)
      check_like("all_gather_coalesced", "output_tensor_lists[" + std::to_string(i) + "][" + std::to_string(r) + "]",
                 outputs[i][r], inputs[i], in_name.c_str(), inputs[i].numel());
  }
  std::unique_lock<std::mutex> g(mu_);
  // One route for the whole call, as all_gather_into_tensor_coalesced;
  // outputs that are not contiguous are staged.
  cuda_ipc::RouteQuery q = query_for("all_gather_coalesced", inputs[0]);
  for (size_t i = 0; i < inputs.size(); ++i) {
    q.nbytes = std::max<int64_t>(q.nbytes, int64_t(inputs[i].nbytes()));
    q.contiguous = q.contiguous && inputs[i].is_contiguous();
    q.on_rank_device = q.on_rank_device && inputs[i].get_device() == device_;
    for (const at::Tensor& o : outputs[i]) q.on_rank_device = q.on_rank_device && o.get_device() == device_;
  }
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("all_gather_coalesced", q);
    g.unlock();
    return fallback_->allgather_coalesced(outputs, inputs, opts);
  }
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  c10::cuda::CUDAGuard guard(inputs[0].device());
  const c10::cuda::CUDAStream stream = begin_ipc("all_gather_coalesced", inputs[0], timeout);
  StagedOutputs staged;
  std::vector<at::Tensor> all;
  for (size_t i = 0; i < inputs.size(); ++i) {
    void* outs[cuda_ipc::kMaxIpcRanks];
    for (int r = 0; r < getSize(); ++r) outs[r] = staged.add(outputs[i][size_t(r)]);
    C10_CUDA_CHECK(cuda_ipc::allgather_ipc(link_->ep->comm(), descriptor_dtype(inputs[i]), inputs[i].numel(),
                                           inputs[i].const_data_ptr(), outs, int64_t(inputs[i].nbytes()), stream));
    all.insert(all.end(), outputs[i].begin(), outputs[i].end());
  }
  staged.finish();
  return ipc_work(c10d::OpType::ALLGATHER_COALESCED, "all_gather_coalesced", std::move(all), stream, timeout);
}

// ---------------------------------------------------------------- root-list and all-to-all collectives
//
// Only some ranks hold some of these tensors (gather's outputs on the root,
// scatter's inputs on the root), so the route is decided from what every
// rank holds (its own input / output); list entries that are not contiguous
// go through contiguous temporaries copied on the same stream (StagedOutputs,
// .contiguous()).

c10::intrusive_ptr<c10d::Work> CudaBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                   std::vector<at::Tensor>& inputs,
                                                   const c10d::GatherOptions& opts) {
  TORCH_CHECK_VALUE(inputs.size() == 1, "fastpar.gather: expected exactly one input tensor (one per process), got ",
                    inputs.size());
  const at::Tensor& in = inputs[0];
  check_cuda("gather", "tensor", in);
  check_root("gather", opts.rootRank, getSize());
  const bool root = getRank() == opts.rootRank;
  if (root) {
    TORCH_CHECK_VALUE(outputs.size() == 1 && int64_t(outputs[0].size()) == getSize(), "fastpar.gather: gather_list "
                      "on the root must hold ", getSize(), " tensors (one per rank), got ",
                      outputs.empty() ? 0 : outputs[0].size());
    for (size_t q = 0; q < outputs[0].size(); ++q) {
      const at::Tensor& o = outputs[0][q];
      check_like("gather", "gather_list[" + std::to_string(q) + "]", o, in, "tensor", in.numel());
      TORCH_CHECK_VALUE(o.device() == in.device(), "fastpar.gather: gather_list[", q, "] is on '", o.device().str(),
                        "' but tensor is on '", in.device().str(), "'");
    }
  } else {
    TORCH_CHECK_VALUE(outputs.empty() || outputs[0].empty(), "fastpar.gather: gather_list must be empty on "
                      "non-root ranks, got ", outputs[0].size(), " tensors on rank ", getRank());
  }
  std::unique_lock<std::mutex> g(mu_);
  const cuda_ipc::RouteQuery q = query_for("gather", in);
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("gather", q);
    g.unlock();
    return fallback_->gather(outputs, inputs, opts);
  }
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  c10::cuda::CUDAGuard guard(in.device());
  const c10::cuda::CUDAStream stream = begin_ipc("gather", in, timeout);
  StagedOutputs staged;
  void* outs[cuda_ipc::kMaxIpcRanks] = {};
  if (root)
    for (int r = 0; r < getSize(); ++r) outs[r] = staged.add(outputs[0][size_t(r)]);
  C10_CUDA_CHECK(cuda_ipc::gather_ipc(link_->ep->comm(), descriptor_dtype(in), in.numel(), in.const_data_ptr(),
                                      outs, int64_t(in.nbytes()), int(opts.rootRank), stream));
  staged.finish();
  return ipc_work(c10d::OpType::GATHER, "gather", root ? outputs[0] : std::vector<at::Tensor>{}, stream, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::scatter(std::vector<at::Tensor>& outputs,
                                                    std::vector<std::vector<at::Tensor>>& inputs,
                                                    const c10d::ScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == 1, "fastpar.scatter: expected exactly one output tensor (one per process), got ",
                    outputs.size());
  at::Tensor& out = outputs[0];
  check_cuda("scatter", "tensor", out);
  check_root("scatter", opts.rootRank, getSize());
  const bool root = getRank() == opts.rootRank;
  std::vector<at::Tensor> ins;
  if (root) {
    TORCH_CHECK_VALUE(inputs.size() == 1 && int64_t(inputs[0].size()) == getSize(), "fastpar.scatter: scatter_list "
                      "on the root must hold ", getSize(), " tensors (one per rank), got ",
                      inputs.empty() ? 0 : inputs[0].size());
    for (size_t q = 0; q < inputs[0].size(); ++q) {
      const at::Tensor& x = inputs[0][q];
      check_like("scatter", "scatter_list[" + std::to_string(q) + "]", x, out, "tensor", out.numel());
      TORCH_CHECK_VALUE(x.device() == out.device(), "fastpar.scatter: scatter_list[", q, "] is on '",
                        x.device().str(), "' but tensor is on '", out.device().str(), "'");
    }
  } else {
    TORCH_CHECK_VALUE(inputs.empty() || inputs[0].empty(), "fastpar.scatter: scatter_list must be empty on "
                      "non-root ranks, got ", inputs[0].size(), " tensors on rank ", getRank());
  }
  std::unique_lock<std::mutex> g(mu_);
  const cuda_ipc::RouteQuery q = query_for("scatter", out);
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("scatter", q);
    g.unlock();
    return fallback_->scatter(outputs, inputs, opts);
  }
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  c10::cuda::CUDAGuard guard(out.device());
  const c10::cuda::CUDAStream stream = begin_ipc("scatter", out, timeout);
  const void* srcs[cuda_ipc::kMaxIpcRanks] = {};
  if (root) {
    for (int r = 0; r < getSize(); ++r) {
      ins.push_back(inputs[0][size_t(r)].contiguous());  // a copy on the current stream when strided
      srcs[r] = ins.back().const_data_ptr();
    }
  }
  C10_CUDA_CHECK(cuda_ipc::scatter_ipc(link_->ep->comm(), descriptor_dtype(out), out.numel(), srcs,
                                       out.data_ptr(), int64_t(out.nbytes()), int(opts.rootRank), stream));
  return ipc_work(c10d::OpType::SCATTER, "scatter", outputs, stream, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::barrier(const c10d::BarrierOptions& opts) {
  std::unique_lock<std::mutex> g(mu_);
  if (link_) {
    // One phase over IPC on this rank's device; like NCCL's barrier, wait()
    // holds the host until every rank has arrived.
    const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
    c10::cuda::CUDAGuard guard{c10::DeviceIndex(device_)};
    const c10::cuda::CUDAStream stream = begin_ipc("barrier", device_, timeout);
    C10_CUDA_CHECK(cuda_ipc::barrier_ipc(link_->ep->comm(), stream));
    return ipc_work(c10d::OpType::BARRIER, "barrier", {}, stream, timeout, /*host_wait=*/true);
  }
  // Before IPC is set up (it is collective, and a barrier names no device to
  // set it up on) or without it: NCCL, told our device when we know it
  // (without device_ids torch 2.11's NCCL barrier guesses rank % GPUs).
  const int device = device_;
  g.unlock();
  refuse_on_shared_gpu("barrier");
  c10d::BarrierOptions o = opts;
  if (o.device_ids.empty() && device >= 0) o.device_ids = {device};
  return fallback_->barrier(o);
}

}  // namespace distributed
}  // namespace fastpar
