// CudaEngine's collectives (cuda_engine.h): each asks the route
// (route.h) and enqueues the IPC schedule (core/executors/cuda_ipc) on the
// caller's current stream, or hands the call to the fallback (NCCL). The
// front (backend.h) has checked the arguments.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>

#include "../../core/executors/cuda_ipc/ipc_allreduce.h"
#include "../../core/executors/cuda_ipc/ipc_collectives.h"
#include "../dtypes.h"  // maybe_dtype
#include "cuda_engine.h"
#include "route.h"

namespace fastpar {
namespace distributed {

using namespace cuda_args;
using Work = c10::intrusive_ptr<c10d::Work>;
using cuda_ipc::IpcComm;
using cuda_ipc::RouteQuery;
using Stream = c10::cuda::CUDAStream;

// The one shape of every IPC collective: under mu_, the route for `t`
// (`adjust` adds what the call knows about its other tensors) picks IPC or
// the fallback; over IPC, `launch` enqueues the schedule on the caller's
// current stream of `t`'s device, and the call's Work waits for it.
template <class Adjust, class Launch, class Fallback>
Work CudaEngine::run(const char* op, c10d::OpType type, const at::Tensor& t, std::chrono::milliseconds given,
                     std::vector<at::Tensor> outputs, Adjust&& adjust, Launch&& launch, Fallback&& fallback,
                     bool capturable) {
  std::unique_lock<std::mutex> g(mu_);
  c10::cuda::CUDAGuard guard(t.device());
  const std::chrono::milliseconds timeout = call_timeout(given, timeout_);
  const std::optional<Stream> stream = try_ipc(op, t, timeout, g, adjust, launch, capturable);
  if (!stream) return fallback();
  return ipc_work(type, op, std::move(outputs), *stream, timeout);
}

// run()'s IPC half (mu_ held by `g`, `t`'s device current): the stream the
// call is enqueued on, or none when the route hands it to the fallback (then
// `g` is released).
template <class Adjust, class Launch>
std::optional<Stream> CudaEngine::try_ipc(const char* op, const at::Tensor& t, std::chrono::milliseconds timeout,
                                          std::unique_lock<std::mutex>& g, Adjust&& adjust, Launch&& launch,
                                          bool capturable) {
  RouteQuery q = query_for(op, t);
  adjust(q);
  if (to_fallback(op, q, g)) return std::nullopt;
  const Stream stream = begin_ipc(op, t, timeout, capturable);
  launch(link_->ep->comm(), stream, q);
  return stream;
}

namespace {

ReduceOp reduction(const c10d::ReduceOp& op) { return ReduceOp(int(op.op_)); }

// The route's view of a reduction over tensors of `t`'s dtype.
auto reducing(const at::Tensor& t, const c10d::ReduceOp& op) {
  return [dt = maybe_dtype(t.scalar_type()), op](RouteQuery& q) {
    q.dtype_supported = q.dtype_supported && dt.has_value();
    q.op_supported = q.op_supported && reduces(dt, op);
  };
}

// The route's view of a call's other tensors: every one contiguous (where the
// kernels read or write it directly) and on the rank's IPC device. (The size
// the route weighs is the routed tensor's; coalesced calls take their largest.)
void also(RouteQuery& q, const at::Tensor& t, int device, bool need_contiguous = true) {
  q.contiguous = q.contiguous && (!need_contiguous || t.is_contiguous());
  q.on_rank_device = q.on_rank_device && t.get_device() == device;
}

const auto nothing = [](RouteQuery&) {};

// Rank r's block of a flat tensor of `world` blocks of `block` bytes.
char* block(const at::Tensor& flat, int64_t block_bytes, int r) {
  return static_cast<char*>(flat.data_ptr()) + block_bytes * r;
}

}  // namespace

// all_reduce's schedule for `t` over IPC, on `stream` (begin_ipc done).
void CudaEngine::launch_allreduce(IpcComm& c, const Stream& stream, const RouteQuery& q, at::Tensor& t,
                                  ReduceOp rop) {
  const DType dt = *maybe_dtype(t.scalar_type());
  if (call_captured_) {
    // The kernel a replay can repeat (core/executors/cuda_ipc/ipc_fused_one_shot.h,
    // "the all_reduce a CUDA graph can capture"): its own flags and
    // slot, no host counter.
    TORCH_CHECK_VALUE(q.nbytes <= slot_bytes_, "fastpar.all_reduce: a CUDA graph can capture an all_reduce "
                      "over CUDA IPC of at most FASTPAR_CUDA_IPC_SLOT_BYTES = ", slot_bytes_,
                      " bytes, but tensors[0] has ", q.nbytes, " bytes");
    if (t.numel() > 0)
      C10_CUDA_CHECK(cuda_ipc::allreduce_graphed(c, dt, rop, t.const_data_ptr(), t.data_ptr(), t.numel(), stream));
  } else if (t.numel() > 0 && getSize() > 1) {
    const int64_t reg = registered_offset(t);
    if (cuda_ipc::prefer_one_shot(q.nbytes, c, one_shot_max_bytes())) {
      C10_CUDA_CHECK(cuda_ipc::allreduce_one_shot(c, dt, rop, t.const_data_ptr(), t.data_ptr(), t.numel(), stream));
    } else if (reg >= 0) {
      // A registered tensor (registered_empty): no copy-in. Every rank's
      // must be; the offset in the descriptor makes a mix fail on every rank.
      C10_CUDA_CHECK(cuda_ipc::allreduce_registered(c, dt, rop, reg, t.numel(), stream));
    } else {
      C10_CUDA_CHECK(cuda_ipc::allreduce_two_shot(c, dt, rop, t.const_data_ptr(), t.data_ptr(), t.numel(), stream));
    }
  }
}

Work CudaEngine::allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  at::Tensor& t = tensors[0];
  const ReduceOp rop = reduction(opts.reduceOp);
  return run(
      "all_reduce", c10d::OpType::ALLREDUCE, t, opts.timeout, tensors, reducing(t, opts.reduceOp),
      [&](IpcComm& c, const Stream& stream, const RouteQuery& q) { launch_allreduce(c, stream, q, t, rop); },
      [&] { return fallback_->allreduce(tensors, opts); }, /*capturable=*/true);
}

// allreduce() without the Work, and so without its event: the kernels are on
// the caller's current stream already, which is all the Work's wait() would
// order. What else wait() does stays: the host blocks where it would (the
// knob, a dead or aborted peer; never in a capture) and a failure this rank
// has recorded is raised.
void CudaEngine::allreduce_direct(at::Tensor& t, const c10d::AllreduceOptions& opts) {
  std::unique_lock<std::mutex> g(mu_);
  c10::cuda::CUDAGuard guard(t.device());
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  const ReduceOp rop = reduction(opts.reduceOp);
  const std::optional<Stream> stream = try_ipc(
      "all_reduce", t, timeout, g, reducing(t, opts.reduceOp),
      [&](IpcComm& c, const Stream& s, const RouteQuery& q) { launch_allreduce(c, s, q, t, rop); },
      /*capturable=*/true);
  if (!stream) {
    std::vector<at::Tensor> ts{t};
    fallback_->allreduce(ts, opts)->wait();
    return;
  }
  ++direct_calls_;
  const bool captured = call_captured_;
  const std::shared_ptr<const IpcLink> link = link_;
  g.unlock();
  if (!captured && (blocking_wait_ || link->must_block()))
    C10_CUDA_CHECK(cudaStreamSynchronize(stream->stream()));
  link->throw_if_failed("all_reduce", getRank(), timeout);
}

Work CudaEngine::allreduce_coalesced(std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  return run(
      "all_reduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED, tensors[0], opts.timeout, tensors,
      [&](RouteQuery& q) {
        for (const at::Tensor& t : tensors) {
          reducing(t, opts.reduceOp)(q);
          also(q, t, device_);
          q.nbytes = std::max<int64_t>(q.nbytes, int64_t(t.nbytes()));
        }
      },
      [&](IpcComm& c, const Stream& stream, const RouteQuery&) {
        for (at::Tensor& t : tensors) {
          if (t.numel() == 0 || getSize() == 1) continue;  // as all_reduce: every rank skips the same entries
          const DType dt = *maybe_dtype(t.scalar_type());
          const auto launch = cuda_ipc::prefer_one_shot(int64_t(t.nbytes()), c, one_shot_max_bytes())
                                  ? cuda_ipc::allreduce_one_shot
                                  : cuda_ipc::allreduce_two_shot;
          C10_CUDA_CHECK(launch(c, dt, reduction(opts.reduceOp), t.const_data_ptr(), t.data_ptr(), t.numel(), stream));
        }
      },
      [&] { return fallback_->allreduce_coalesced(tensors, opts); });
}

Work CudaEngine::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  at::Tensor& t = tensors[0];
  return run(
      "broadcast", c10d::OpType::BROADCAST, t, opts.timeout, tensors, nothing,
      [&](IpcComm& c, const Stream& stream, const RouteQuery&) {
        // Every call runs its phases, even with one rank or no bytes: the
        // descriptor check is what catches a desynced peer.
        C10_CUDA_CHECK(cuda_ipc::broadcast_ipc(c, descriptor_dtype(t), t.numel(), t.data_ptr(), int64_t(t.nbytes()),
                                               int(opts.rootRank), stream));
      },
      [&] { return fallback_->broadcast(tensors, opts); });
}

Work CudaEngine::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  at::Tensor& t = tensors[0];
  return run(
      "reduce", c10d::OpType::REDUCE, t, opts.timeout, tensors, reducing(t, opts.reduceOp),
      [&](IpcComm& c, const Stream& stream, const RouteQuery&) {
        C10_CUDA_CHECK(cuda_ipc::reduce_ipc(c, *maybe_dtype(t.scalar_type()), reduction(opts.reduceOp),
                                            t.const_data_ptr(), t.data_ptr(), t.numel(), int(opts.rootRank), stream));
      },
      [&] { return fallback_->reduce(tensors, opts); });
}

// Output lists are routed by the input (what torch makes equal on every
// rank); entries that are not contiguous are staged (StagedOutputs).
Work CudaEngine::allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                           const c10d::AllgatherOptions& opts) {
  const at::Tensor& in = inputs[0];
  return run(
      "all_gather", c10d::OpType::ALLGATHER, in, opts.timeout, outputs[0],
      [&](RouteQuery& q) {
        for (const at::Tensor& o : outputs[0]) also(q, o, device_, /*need_contiguous=*/false);
      },
      [&](IpcComm& c, const Stream& stream, const RouteQuery&) {
        StagedOutputs staged;
        void* outs[cuda_ipc::kMaxIpcRanks];
        for (int r = 0; r < getSize(); ++r) outs[r] = staged.add(outputs[0][size_t(r)]);
        C10_CUDA_CHECK(cuda_ipc::allgather_ipc(c, descriptor_dtype(in), in.numel(), in.const_data_ptr(), outs,
                                               int64_t(in.nbytes()), stream));
        staged.finish();
      },
      [&] { return fallback_->allgather(outputs, inputs, opts); });
}

Work CudaEngine::_allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  std::vector<at::Tensor> outputs{output}, inputs{input};
  return allgather_flat("all_gather_into_tensor", c10d::OpType::_ALLGATHER_BASE, outputs, inputs, opts.timeout,
                        [&] { return fallback_->_allgather_base(output, input, opts); });
}

Work CudaEngine::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                 const c10d::AllgatherOptions& opts) {
  return allgather_flat("all_gather_into_tensor_coalesced", kAllgatherIntoTensorCoalesced, outputs, inputs,
                        opts.timeout,
                        [&] { return fallback_->allgather_into_tensor_coalesced(outputs, inputs, opts); });
}

// One route for the whole call: every pair must qualify; the size weighed is
// the largest input's.
Work CudaEngine::allgather_flat(const char* op, c10d::OpType type, std::vector<at::Tensor>& outputs,
                                std::vector<at::Tensor>& inputs, std::chrono::milliseconds timeout,
                                const std::function<Work()>& fallback) {
  return run(
      op, type, inputs[0], timeout, outputs,
      [&](RouteQuery& q) {
        for (size_t i = 0; i < inputs.size(); ++i) {
          also(q, inputs[i], device_);
          also(q, outputs[i], device_);
          q.nbytes = std::max<int64_t>(q.nbytes, int64_t(inputs[i].nbytes()));
        }
      },
      [&](IpcComm& c, const Stream& stream, const RouteQuery&) {
        for (size_t i = 0; i < inputs.size(); ++i) {
          const int64_t b = int64_t(inputs[i].nbytes());
          void* outs[cuda_ipc::kMaxIpcRanks];
          for (int r = 0; r < getSize(); ++r) outs[r] = block(outputs[i], b, r);
          C10_CUDA_CHECK(cuda_ipc::allgather_ipc(c, descriptor_dtype(inputs[i]), inputs[i].numel(),
                                                 inputs[i].const_data_ptr(), outs, b, stream));
        }
      },
      fallback);
}

Work CudaEngine::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                     const c10d::AllgatherOptions& opts) {
  std::vector<at::Tensor> all;
  for (const auto& list : outputs) all.insert(all.end(), list.begin(), list.end());
  return run(
      "all_gather_coalesced", c10d::OpType::ALLGATHER_COALESCED, inputs[0], opts.timeout, all,
      [&](RouteQuery& q) {
        for (const at::Tensor& in : inputs) {
          also(q, in, device_);
          q.nbytes = std::max<int64_t>(q.nbytes, int64_t(in.nbytes()));
        }
        for (const at::Tensor& o : all) also(q, o, device_, /*need_contiguous=*/false);
      },
      [&](IpcComm& c, const Stream& stream, const RouteQuery&) {
        StagedOutputs staged;
        for (size_t i = 0; i < inputs.size(); ++i) {
          void* outs[cuda_ipc::kMaxIpcRanks];
          for (int r = 0; r < getSize(); ++r) outs[r] = staged.add(outputs[size_t(r)][i]);  // rank r's inputs[i]
          C10_CUDA_CHECK(cuda_ipc::allgather_ipc(c, descriptor_dtype(inputs[i]), inputs[i].numel(),
                                                 inputs[i].const_data_ptr(), outs, int64_t(inputs[i].nbytes()), stream));
        }
        staged.finish();
      },
      [&] { return fallback_->allgather_coalesced(outputs, inputs, opts); });
}

Work CudaEngine::reduce_scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                const c10d::ReduceScatterOptions& opts) {
  at::Tensor& out = outputs[0];
  return run(
      "reduce_scatter", c10d::OpType::REDUCE_SCATTER, out, opts.timeout, outputs,
      [&](RouteQuery& q) {
        reducing(out, opts.reduceOp)(q);
        for (const at::Tensor& x : inputs[0]) also(q, x, device_);
      },
      [&](IpcComm& c, const Stream& stream, const RouteQuery&) {
        const void* ins[cuda_ipc::kMaxIpcRanks];
        for (int r = 0; r < getSize(); ++r) ins[r] = inputs[0][size_t(r)].const_data_ptr();
        C10_CUDA_CHECK(cuda_ipc::reduce_scatter_ipc(c, *maybe_dtype(out.scalar_type()), reduction(opts.reduceOp),
                                                    ins, out.data_ptr(), out.numel(), stream));
      },
      [&] { return fallback_->reduce_scatter(outputs, inputs, opts); });
}

Work CudaEngine::_reduce_scatter_base(at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  std::vector<at::Tensor> outputs{output}, inputs{input};
  return reduce_scatter_flat("reduce_scatter_tensor", c10d::OpType::_REDUCE_SCATTER_BASE, outputs, inputs,
                             opts.reduceOp, opts.timeout,
                             [&] { return fallback_->_reduce_scatter_base(output, input, opts); });
}

Work CudaEngine::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                 const c10d::ReduceScatterOptions& opts) {
  return reduce_scatter_flat("reduce_scatter_tensor_coalesced", kReduceScatterTensorCoalesced, outputs, inputs,
                             opts.reduceOp, opts.timeout,
                             [&] { return fallback_->reduce_scatter_tensor_coalesced(outputs, inputs, opts); });
}

// As allgather_flat, the other way: the size weighed is the largest output's.
Work CudaEngine::reduce_scatter_flat(const char* op, c10d::OpType type, std::vector<at::Tensor>& outputs,
                                     std::vector<at::Tensor>& inputs, const c10d::ReduceOp& reduce_op,
                                     std::chrono::milliseconds timeout, const std::function<Work()>& fallback) {
  return run(
      op, type, outputs[0], timeout, outputs,
      [&](RouteQuery& q) {
        for (size_t i = 0; i < outputs.size(); ++i) {
          reducing(outputs[i], reduce_op)(q);
          also(q, outputs[i], device_);
          also(q, inputs[i], device_);
          q.nbytes = std::max<int64_t>(q.nbytes, int64_t(outputs[i].nbytes()));
        }
      },
      [&](IpcComm& c, const Stream& stream, const RouteQuery&) {
        for (size_t i = 0; i < outputs.size(); ++i) {
          const int64_t b = int64_t(outputs[i].nbytes());
          const void* ins[cuda_ipc::kMaxIpcRanks];
          for (int r = 0; r < getSize(); ++r) ins[r] = block(inputs[i], b, r);
          C10_CUDA_CHECK(cuda_ipc::reduce_scatter_ipc(c, *maybe_dtype(outputs[i].scalar_type()),
                                                      reduction(reduce_op), ins, outputs[i].data_ptr(),
                                                      outputs[i].numel(), stream));
        }
      },
      fallback);
}

// Only the root holds gather's outputs and scatter's inputs, so these are
// routed by what every rank holds (its own input / output); list entries that
// are not contiguous go through contiguous temporaries on the same stream.
Work CudaEngine::gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                        const c10d::GatherOptions& opts) {
  const at::Tensor& in = inputs[0];
  const bool root = getRank() == opts.rootRank;
  return run(
      "gather", c10d::OpType::GATHER, in, opts.timeout, root ? outputs[0] : std::vector<at::Tensor>{}, nothing,
      [&](IpcComm& c, const Stream& stream, const RouteQuery&) {
        StagedOutputs staged;
        void* outs[cuda_ipc::kMaxIpcRanks] = {};
        if (root)
          for (int r = 0; r < getSize(); ++r) outs[r] = staged.add(outputs[0][size_t(r)]);
        C10_CUDA_CHECK(cuda_ipc::gather_ipc(c, descriptor_dtype(in), in.numel(), in.const_data_ptr(), outs,
                                            int64_t(in.nbytes()), int(opts.rootRank), stream));
        staged.finish();
      },
      [&] { return fallback_->gather(outputs, inputs, opts); });
}

Work CudaEngine::scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                         const c10d::ScatterOptions& opts) {
  at::Tensor& out = outputs[0];
  const bool root = getRank() == opts.rootRank;
  return run(
      "scatter", c10d::OpType::SCATTER, out, opts.timeout, outputs, nothing,
      [&](IpcComm& c, const Stream& stream, const RouteQuery&) {
        std::vector<at::Tensor> ins;
        const void* srcs[cuda_ipc::kMaxIpcRanks] = {};
        if (root) {
          for (int r = 0; r < getSize(); ++r) {
            ins.push_back(inputs[0][size_t(r)].contiguous());  // a copy on the current stream when strided
            srcs[r] = ins.back().const_data_ptr();
          }
        }
        C10_CUDA_CHECK(cuda_ipc::scatter_ipc(c, descriptor_dtype(out), out.numel(), srcs, out.data_ptr(),
                                             int64_t(out.nbytes()), int(opts.rootRank), stream));
      },
      [&] { return fallback_->scatter(outputs, inputs, opts); });
}

Work CudaEngine::barrier(const c10d::BarrierOptions& opts) {
  std::unique_lock<std::mutex> g(mu_);
  if (link_) {
    // One phase over IPC on this rank's device; like NCCL's barrier, wait()
    // holds the host until every rank has arrived.
    const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
    c10::cuda::CUDAGuard guard{c10::DeviceIndex(device_)};
    const Stream stream = begin_ipc("barrier", device_, timeout);
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
