// CudaEngine's point to point (send, recv) and all-to-all: without split sizes
// it runs the phase-protocol schedule; with split sizes (the front's packing
// of the list form has them) every pair's message goes over the per-pair p2p rings
// (core/executors/cuda_ipc/ipc_p2p.h), on a stream per peer and direction.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdlib>
#include <functional>
#include <memory>

#include "../../core/executors/cuda_ipc/ipc_collectives.h"
#include "../../core/executors/cuda_ipc/ipc_p2p.h"
#include "route.h"
#include "../../core/transport/cuda_p2p/handle_cache.h"
#include "checks.h"  // all_to_all_split
#include "cuda_engine.h"

namespace fastpar {
namespace distributed {

using namespace cuda_args;

Work CudaEngine::all_to_all(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
                            std::vector<int64_t>& input_split_sizes, const Call& c) {
  const int n = size();
  const bool split = !input_split_sizes.empty() || !output_split_sizes.empty();
  std::vector<int64_t> in_b, out_b;
  if (split) {
    const int64_t in_rows = input.dim() == 0 ? 1 : input.size(0), out_rows = output.dim() == 0 ? 1 : output.size(0);
    auto row_bytes = [](const at::Tensor& t, int64_t rows) { return rows == 0 ? 0 : int64_t(t.nbytes()) / rows; };
    in_b = checks::all_to_all_split("input", input_split_sizes, in_rows, row_bytes(input, in_rows), n);
    out_b = checks::all_to_all_split("output", output_split_sizes, out_rows, row_bytes(output, out_rows), n);
  }
  std::unique_lock<std::mutex> g(mu_);
  cuda_ipc::RouteQuery q = query_for("all_to_all_single", input);
  q.contiguous = input.is_contiguous() && output.is_contiguous();
  q.on_rank_device = q.on_rank_device && output.device() == input.device();
  if (split) {
    // Split sizes given: the per-pair rings (see all_to_all_pairs). The
    // sizes, and whether they happen to be equal, differ by rank, so the
    // route is picked by the call's form, which every rank shares, and not
    // by the threshold (FASTPAR_CUDA_IPC_MAX_BYTES=0 still turns IPC off).
    q.nbytes = 0;
    if (to_fallback("all_to_all_single", q, g))
      return fallback_->all_to_all(output, input, output_split_sizes, input_split_sizes, c);
    std::vector<const void*> ins(static_cast<size_t>(n));
    std::vector<void*> outs(static_cast<size_t>(n));
    int64_t io = 0, oo = 0;
    for (int r = 0; r < n; ++r) {
      ins[size_t(r)] = static_cast<const char*>(input.const_data_ptr()) + io;
      outs[size_t(r)] = static_cast<char*>(output.data_ptr()) + oo;
      io += in_b[size_t(r)];
      oo += out_b[size_t(r)];
    }
    return all_to_all_pairs("all_to_all_single", c10d::OpType::ALLTOALL_BASE, ins, in_b, outs, out_b,
                            {input, output}, {output}, call_timeout(c.timeout, timeout_), nullptr);  // no staging
  }
  // No split sizes: n equal blocks, the same on every rank (the collective's
  // rules), so the phase-protocol schedule and the size threshold apply.
  if (to_fallback("all_to_all_single", q, g))
    return fallback_->all_to_all(output, input, output_split_sizes, input_split_sizes, c);
  const std::chrono::milliseconds timeout = call_timeout(c.timeout, timeout_);
  c10::cuda::CUDAGuard guard(input.device());
  const c10::cuda::CUDAStream stream = begin_ipc("all_to_all_single", input, timeout);
  const int64_t block = int64_t(input.nbytes()) / n;
  const void* srcs[cuda_ipc::kMaxIpcRanks];
  void* dsts[cuda_ipc::kMaxIpcRanks];
  for (int r = 0; r < n; ++r) {
    srcs[r] = static_cast<const char*>(input.const_data_ptr()) + block * r;
    dsts[r] = static_cast<char*>(output.data_ptr()) + block * r;
  }
  C10_CUDA_CHECK(cuda_ipc::all_to_all_ipc(link_->ep->comm(), descriptor_dtype(input), input.numel() / n, srcs,
                                          dsts, block, stream));
  return ipc_work(c10d::OpType::ALLTOALL_BASE, "all_to_all_single", {output}, stream, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaEngine::all_to_all_pairs(const char* op, c10d::OpType type,
                                                             const std::vector<const void*>& ins,
                                                             const std::vector<int64_t>& in_bytes,
                                                             const std::vector<void*>& outs,
                                                             const std::vector<int64_t>& out_bytes,
                                                             const std::vector<at::Tensor>& keep,
                                                             std::vector<at::Tensor> outputs,
                                                             std::chrono::milliseconds timeout,
                                                             const std::function<void()>& after) {
  const int n = size(), r = rank();
  const at::Tensor& like = keep[0];
  c10::cuda::CUDAGuard guard(like.device());
  const c10::cuda::CUDAStream current = begin_ipc(op, like, timeout, /*capturable=*/false, /*phased=*/false);
  cuda_ipc::IpcComm& c = link_->ep->comm();
  PooledEvent ready = ipc_event();
  ready.record(current);
  std::vector<c10::cuda::CUDAStream> used;
  for (int q = 0; q < n; ++q) {
    if (q == r) continue;
    for (bool is_send : {true, false}) {
      const c10::cuda::CUDAStream side = p2p_stream(q, is_send);
      ready.block(side);
      for (const at::Tensor& t : keep) t.record_stream(side.unwrap());
      if (is_send) {
        C10_CUDA_CHECK(cuda_ipc::send_ipc(c, ins[size_t(q)], in_bytes[size_t(q)], q, kAllToAllTag, side));
      } else {
        C10_CUDA_CHECK(cuda_ipc::recv_ipc(c, outs[size_t(q)], out_bytes[size_t(q)], q, kAllToAllTag, side));
      }
      used.push_back(side);
    }
  }
  if (in_bytes[size_t(r)] > 0)
    C10_CUDA_CHECK(cudaMemcpyAsync(outs[size_t(r)], ins[size_t(r)], size_t(in_bytes[size_t(r)]),
                                   cudaMemcpyDeviceToDevice, current));
  // The call completes on the caller's stream, like every other collective.
  for (const c10::cuda::CUDAStream& side : used) {
    PooledEvent done = ipc_event();
    done.record(side);
    done.block(current);
  }
  if (after) after();
  return ipc_work(type, op, std::move(outputs), current, timeout);
}

Work CudaEngine::send(at::Tensor& t, int peer, int tag) {
  return point_to_point("send", t, peer, tag, /*is_send=*/true);
}

// `peer` -1: from any rank. The IPC rings match in order per pair
// (p2p_ring.h): learning which peer's message came first would need a
// device-to-host read before the copy is enqueued; NCCL has no any-source
// receive either.
Work CudaEngine::recv(at::Tensor& t, int peer, int tag) {
  if (peer >= 0) return point_to_point("recv", t, peer, tag, /*is_send=*/false);
  TORCH_CHECK_VALUE(!shares_gpu(), "fastpar.recv: a receive from any source (src=None) of a CUDA tensor is not "
                    "supported: CUDA IPC matches messages per sender and NCCL has no any-source receive; name "
                    "the source rank");
  return fallback_->recv(t, -1, tag);
}

c10::cuda::CUDAStream CudaEngine::p2p_stream(int peer, bool is_send) {
  if (own_streams_.empty()) {
    // Streams of our own, not torch's pool: the pool hands its 32 streams
    // round-robin to everyone (torch.cuda.Stream(), DDP's callbacks), and a
    // step that waits for the peer must never queue behind, or hold up, work
    // it does not order with. Every peer's pair at once, from the process's
    // stream cache (cuda_p2p/handle_cache.h says why they are never
    // destroyed, and why taken in one run).
    const int n = size(), r = rank();
    // One hardware queue for every stream: a send step waiting for ring space
    // holds up the receive queued behind it, which would have freed it.
    const char* connections = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    if (connections != nullptr && std::string(connections) == "1") {
      TORCH_WARN_ONCE("fastpar: CUDA_DEVICE_MAX_CONNECTIONS=1 puts every CUDA stream on one hardware queue, so a "
                      "send/recv over CUDA IPC larger than its ring (",
                      cuda_ipc::kP2PChunks * cuda_ipc::kP2PChunkBytes / 1024, " KiB) can wait for a transfer queued "
                      "behind it until the group's timeout; set it to 32 for jobs that send and receive over fastpar");
    }
    C10_CUDA_CHECK(cuda_p2p::take_streams(device_, 2 * (n - 1), &own_streams_));
    send_streams_.assign(size_t(n), std::nullopt);
    recv_streams_.assign(size_t(n), std::nullopt);
    size_t k = 0;
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      send_streams_[size_t(q)] = c10::cuda::getStreamFromExternal(own_streams_[k++], c10::DeviceIndex(device_));
      recv_streams_[size_t(q)] = c10::cuda::getStreamFromExternal(own_streams_[k++], c10::DeviceIndex(device_));
    }
  }
  return *(is_send ? send_streams_ : recv_streams_)[size_t(peer)];
}

Work CudaEngine::point_to_point(const char* op, at::Tensor& t, int peer, int tag, bool is_send) {
  std::unique_lock<std::mutex> g(mu_);
  // Setup is collective (every rank meets in the Store), a send is not: only
  // a group set up by its first CUDA collective, or at creation
  // (init_process_group(device_id=...): connect()), can use IPC for it.
  // Before that, NCCL, which cannot run where ranks share a GPU.
  auto nccl = [&] { return is_send ? fallback_->send(t, peer, tag) : fallback_->recv(t, peer, tag); };
  if (!set_up_) {
    ++fallback_calls_;
    g.unlock();
    return nccl();
  }
  cuda_ipc::RouteQuery q = query_for(op, t);
  q.nbytes = 0;  // the pair's ring streams any size: no threshold (docs/cuda.md)
  if (to_fallback(op, q, g)) return nccl();
  const std::chrono::milliseconds timeout = timeout_;
  c10::cuda::CUDAGuard guard(t.device());
  const c10::cuda::CUDAStream current = begin_ipc(op, t, timeout, /*capturable=*/false, /*phased=*/false);
  // One stream per peer and direction: messages to one peer run in the order
  // they were posted (the ring's chunk numbers are counted here, at enqueue),
  // and a large send waiting for its receiver to drain the ring never holds
  // up this rank's receives or its traffic with other peers.
  const c10::cuda::CUDAStream side = p2p_stream(peer, is_send);
  PooledEvent ready = ipc_event();
  ready.record(current);
  ready.block(side);
  // The caching allocator must not reuse the tensor's memory before the side
  // stream is done with it.
  t.record_stream(side.unwrap());
  cuda_ipc::IpcComm& c = link_->ep->comm();
  if (is_send) {
    C10_CUDA_CHECK(cuda_ipc::send_ipc(c, t.data_ptr(), int64_t(t.nbytes()), peer, tag, side));
  } else {
    C10_CUDA_CHECK(cuda_ipc::recv_ipc(c, t.data_ptr(), int64_t(t.nbytes()), peer, tag, side));
  }
  return ipc_work(is_send ? c10d::OpType::SEND : c10d::OpType::RECV, op, {t}, side, timeout);
}

}  // namespace distributed
}  // namespace fastpar
