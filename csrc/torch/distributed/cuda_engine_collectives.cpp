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

// The route's view of a reduction over tensors of `t`'s dtype.
auto reducing(const at::Tensor& t, const Call& c) {
  return [dt = maybe_dtype(t.scalar_type()), &c](RouteQuery& q) {
    q.dtype_supported = q.dtype_supported && dt.has_value();
    q.op_supported = q.op_supported && reduces(dt, c);
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
    // The kernels a replay can repeat (core/executors/cuda_ipc/ipc_graph.h):
    // their own flags and slots, no host counter; the eager call's schedule
    // and grid for the size.
    TORCH_CHECK_VALUE(q.nbytes <= slot_bytes_, "fastpar.all_reduce: a CUDA graph can capture an all_reduce "
                      "over CUDA IPC of at most FASTPAR_CUDA_IPC_SLOT_BYTES = ", slot_bytes_,
                      " bytes, but tensors[0] has ", q.nbytes, " bytes");
    if (t.numel() > 0)
      C10_CUDA_CHECK(cuda_ipc::allreduce_graphed(c, dt, rop, t.const_data_ptr(), t.data_ptr(), t.numel(), stream,
                                                 one_shot_max_bytes()));
  } else if (t.numel() > 0 && size() > 1) {
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

Work CudaEngine::all_reduce(at::Tensor& t, const Call& c) {
  return run(
      "all_reduce", c10d::OpType::ALLREDUCE, t, c.timeout, {t}, reducing(t, c),
      [&](IpcComm& comm, const Stream& stream, const RouteQuery& q) { launch_allreduce(comm, stream, q, t, c.op); },
      [&] { return fallback_->all_reduce(t, c); }, /*capturable=*/true);
}

// all_reduce() without the Work, and so without its event: the kernels are on
// the caller's current stream already, which is all the Work's wait() would
// order. What else wait() does stays: the host blocks where it would (the
// knob, a dead or aborted peer; never in a capture) and a failure this rank
// has recorded is raised.
void CudaEngine::all_reduce_now(at::Tensor& t, const Call& c) {
  std::unique_lock<std::mutex> g(mu_);
  c10::cuda::CUDAGuard guard(t.device());
  const std::chrono::milliseconds timeout = call_timeout(c.timeout, timeout_);
  const std::optional<Stream> stream = try_ipc(
      "all_reduce", t, timeout, g, reducing(t, c),
      [&](IpcComm& comm, const Stream& s, const RouteQuery& q) { launch_allreduce(comm, s, q, t, c.op); },
      /*capturable=*/true);
  if (!stream) {
    fallback_->all_reduce(t, c)->wait();
    return;
  }
  ++direct_calls_;
  const bool captured = call_captured_;
  const std::shared_ptr<const IpcLink> link = link_;
  g.unlock();
  if (!captured && (blocking_wait_ || link->must_block()))
    C10_CUDA_CHECK(cudaStreamSynchronize(stream->stream()));
  link->throw_if_failed("all_reduce", rank(), timeout);
}

Work CudaEngine::all_reduce_coalesced(std::vector<at::Tensor>& tensors, const Call& c) {
  return run(
      "all_reduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED, tensors[0], c.timeout, tensors,
      [&](RouteQuery& q) {
        for (const at::Tensor& t : tensors) {
          reducing(t, c)(q);
          also(q, t, device_);
          q.nbytes = std::max<int64_t>(q.nbytes, int64_t(t.nbytes()));
        }
      },
      [&](IpcComm& comm, const Stream& stream, const RouteQuery&) {
        for (at::Tensor& t : tensors) {
          if (t.numel() == 0 || size() == 1) continue;  // as all_reduce: every rank skips the same entries
          const DType dt = *maybe_dtype(t.scalar_type());
          const auto launch = cuda_ipc::prefer_one_shot(int64_t(t.nbytes()), comm, one_shot_max_bytes())
                                  ? cuda_ipc::allreduce_one_shot
                                  : cuda_ipc::allreduce_two_shot;
          C10_CUDA_CHECK(launch(comm, dt, c.op, t.const_data_ptr(), t.data_ptr(), t.numel(), stream));
        }
      },
      [&] { return fallback_->all_reduce_coalesced(tensors, c); });
}

Work CudaEngine::broadcast(at::Tensor& t, const Call& c) {
  return run(
      "broadcast", c10d::OpType::BROADCAST, t, c.timeout, {t}, nothing,
      [&](IpcComm& comm, const Stream& stream, const RouteQuery&) {
        // Every call runs its phases, even with one rank or no bytes: the
        // descriptor check is what catches a desynced peer.
        C10_CUDA_CHECK(cuda_ipc::broadcast_ipc(comm, descriptor_dtype(t), t.numel(), t.data_ptr(),
                                               int64_t(t.nbytes()), c.root, stream));
      },
      [&] { return fallback_->broadcast(t, c); });
}

Work CudaEngine::reduce(at::Tensor& t, const Call& c) {
  return run(
      "reduce", c10d::OpType::REDUCE, t, c.timeout, {t}, reducing(t, c),
      [&](IpcComm& comm, const Stream& stream, const RouteQuery&) {
        C10_CUDA_CHECK(cuda_ipc::reduce_ipc(comm, *maybe_dtype(t.scalar_type()), c.op, t.const_data_ptr(),
                                            t.data_ptr(), t.numel(), c.root, stream));
      },
      [&] { return fallback_->reduce(t, c); });
}

// Output lists are routed by the input (what torch makes equal on every
// rank); entries that are not contiguous are staged (StagedOutputs).
Work CudaEngine::all_gather(std::vector<at::Tensor>& outs, at::Tensor& in, const Call& c) {
  return run(
      "all_gather", c10d::OpType::ALLGATHER, in, c.timeout, outs,
      [&](RouteQuery& q) {
        for (const at::Tensor& o : outs) also(q, o, device_, /*need_contiguous=*/false);
      },
      [&](IpcComm& comm, const Stream& stream, const RouteQuery&) {
        StagedOutputs staged;
        void* ptrs[cuda_ipc::kMaxIpcRanks];
        for (int r = 0; r < size(); ++r) ptrs[r] = staged.add(outs[size_t(r)]);
        C10_CUDA_CHECK(cuda_ipc::allgather_ipc(comm, descriptor_dtype(in), in.numel(), in.const_data_ptr(), ptrs,
                                               int64_t(in.nbytes()), stream));
        staged.finish();
      },
      [&] { return fallback_->all_gather(outs, in, c); });
}

// all_gather_into_tensor, single (one pair) or coalesced: one route for the
// whole call, every pair must qualify; the size weighed is the largest
// input's.
Work CudaEngine::all_gather_into(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins, const Call& c) {
  const bool one = outs.size() == 1;
  return run(
      one ? "all_gather_into_tensor" : "all_gather_into_tensor_coalesced",
      one ? c10d::OpType::_ALLGATHER_BASE : kAllgatherIntoTensorCoalesced, ins[0], c.timeout, outs,
      [&](RouteQuery& q) {
        for (size_t i = 0; i < ins.size(); ++i) {
          also(q, ins[i], device_);
          also(q, outs[i], device_);
          q.nbytes = std::max<int64_t>(q.nbytes, int64_t(ins[i].nbytes()));
        }
      },
      [&](IpcComm& comm, const Stream& stream, const RouteQuery&) {
        for (size_t i = 0; i < ins.size(); ++i) {
          const int64_t b = int64_t(ins[i].nbytes());
          void* ptrs[cuda_ipc::kMaxIpcRanks];
          for (int r = 0; r < size(); ++r) ptrs[r] = block(outs[i], b, r);
          C10_CUDA_CHECK(cuda_ipc::allgather_ipc(comm, descriptor_dtype(ins[i]), ins[i].numel(),
                                                 ins[i].const_data_ptr(), ptrs, b, stream));
        }
      },
      [&] { return fallback_->all_gather_into(outs, ins, c); });
}

// reduce_scatter_tensor, single or coalesced, as all_gather_into the other
// way: the size weighed is the largest output's.
Work CudaEngine::reduce_scatter(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins, const Call& c) {
  const bool one = outs.size() == 1;
  return run(
      one ? "reduce_scatter_tensor" : "reduce_scatter_tensor_coalesced",
      one ? c10d::OpType::_REDUCE_SCATTER_BASE : kReduceScatterTensorCoalesced, outs[0], c.timeout, outs,
      [&](RouteQuery& q) {
        for (size_t i = 0; i < outs.size(); ++i) {
          reducing(outs[i], c)(q);
          also(q, outs[i], device_);
          also(q, ins[i], device_);
          q.nbytes = std::max<int64_t>(q.nbytes, int64_t(outs[i].nbytes()));
        }
      },
      [&](IpcComm& comm, const Stream& stream, const RouteQuery&) {
        for (size_t i = 0; i < outs.size(); ++i) {
          const int64_t b = int64_t(outs[i].nbytes());
          const void* ptrs[cuda_ipc::kMaxIpcRanks];
          for (int r = 0; r < size(); ++r) ptrs[r] = block(ins[i], b, r);
          C10_CUDA_CHECK(cuda_ipc::reduce_scatter_ipc(comm, *maybe_dtype(outs[i].scalar_type()), c.op, ptrs,
                                                      outs[i].data_ptr(), outs[i].numel(), stream));
        }
      },
      [&] { return fallback_->reduce_scatter(outs, ins, c); });
}

// Only the root holds gather's outputs and scatter's inputs, so these are
// routed by what every rank holds (its own input / output); list entries that
// are not contiguous go through contiguous temporaries on the same stream.
Work CudaEngine::gather(std::vector<at::Tensor>& outs, at::Tensor& in, const Call& c) {
  const bool root = rank() == c.root;
  return run(
      "gather", c10d::OpType::GATHER, in, c.timeout, root ? outs : std::vector<at::Tensor>{}, nothing,
      [&](IpcComm& comm, const Stream& stream, const RouteQuery&) {
        StagedOutputs staged;
        void* ptrs[cuda_ipc::kMaxIpcRanks] = {};
        if (root)
          for (int r = 0; r < size(); ++r) ptrs[r] = staged.add(outs[size_t(r)]);
        C10_CUDA_CHECK(cuda_ipc::gather_ipc(comm, descriptor_dtype(in), in.numel(), in.const_data_ptr(), ptrs,
                                            int64_t(in.nbytes()), c.root, stream));
        staged.finish();
      },
      [&] { return fallback_->gather(outs, in, c); });
}

Work CudaEngine::scatter(at::Tensor& out, std::vector<at::Tensor>& ins, const Call& c) {
  const bool root = rank() == c.root;
  return run(
      "scatter", c10d::OpType::SCATTER, out, c.timeout, {out}, nothing,
      [&](IpcComm& comm, const Stream& stream, const RouteQuery&) {
        std::vector<at::Tensor> held;
        const void* srcs[cuda_ipc::kMaxIpcRanks] = {};
        if (root) {
          for (int r = 0; r < size(); ++r) {
            held.push_back(ins[size_t(r)].contiguous());  // a copy on the current stream when strided
            srcs[r] = held.back().const_data_ptr();
          }
        }
        C10_CUDA_CHECK(cuda_ipc::scatter_ipc(comm, descriptor_dtype(out), out.numel(), srcs, out.data_ptr(),
                                             int64_t(out.nbytes()), c.root, stream));
      },
      [&] { return fallback_->scatter(out, ins, c); });
}

Work CudaEngine::barrier(const Call& c) {
  std::unique_lock<std::mutex> g(mu_);
  if (link_) {
    // One phase over IPC on this rank's device; like NCCL's barrier, wait()
    // holds the host until every rank has arrived.
    const std::chrono::milliseconds timeout = call_timeout(c.timeout, timeout_);
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
  Call o = c;
  if (o.device < 0 && device >= 0) o.device = device;
  return fallback_->barrier(o);
}

}  // namespace distributed
}  // namespace fastpar
