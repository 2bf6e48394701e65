// CUDA implementations of the torch.ops.fastpar primitives: one process, each
// list entry a tensor on some GPU; a GPU may hold several entries (every entry
// is its own buffer, as with repeated "cpu"). The argument checks are the CPU
// ones (checks.h), so both backends reject a mistake with the same message.
//
// Streams: an op that touches several devices runs on one side stream per
// device, ordered against the current streams by SideStreams
// (cuda_side_streams.h), so to the caller it behaves like work enqueued on the
// current streams. An op that touches one device runs on its current stream
// (SideStreams then adds no events), and an allreduce of <= 8 entries on one
// device is a single kernel launch (allreduce_one_launch).
//
// Reading another device's memory: a kernel on device d reads (and writes) a
// tensor on device e in place when d has peer access to e; otherwise the bytes
// are first copied into a staging tensor on d with cudaMemcpyPeerAsync. Which
// path runs never changes the result: the same kernel reduces the same values
// in the same order.
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../../core/algorithms/ring_schedule.h"
#include "../../core/kernels/cuda_reduce_launch.h"
#include "../../core/transport/cuda_p2p/peer_access.h"
#include "../../core/transport/cuda_p2p/peer_copy.h"
#include "../../core/executors/cuda_p2p/ring_allreduce.h"
#include "checks.h"
#include "cuda_side_streams.h"
#include "tuning.h"

namespace fastpar {
namespace ops {
namespace {

using cuda_kernels::kMaxReducePtrs;

c10::DeviceIndex dev(const at::Tensor& t) { return t.device().index(); }

std::string dev_str(c10::DeviceIndex d) { return "cuda:" + std::to_string(int(d)); }

// Tells torch's caching allocator that kernels on `device` access `peer`'s
// memory. Why, on top of cudaDeviceEnablePeerAccess: expandable segments
// (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) and the cudaMallocAsync
// backend map memory with explicit per-device access, granted to a peer only
// through this call; without it our kernels would fault on such tensors.
void grant_allocator_peer_access(c10::DeviceIndex device, c10::DeviceIndex peer) {
  static std::mutex mutex;
  static std::set<std::pair<c10::DeviceIndex, c10::DeviceIndex>> granted;
  std::lock_guard<std::mutex> lock(mutex);
  if (granted.count({device, peer})) return;
  c10::cuda::CUDACachingAllocator::enablePeerAccess(device, peer);
  granted.insert({device, peer});
}

bool peer_ok(c10::DeviceIndex device, c10::DeviceIndex peer) {
  // The test model without peer access (tuning.h): every read of another
  // entry goes through a staging copy, even on one GPU.
  if (tuning().device_model == DeviceModel::kDistinctStaging) return false;
  bool ok = false;
  C10_CUDA_CHECK(cuda_p2p::ensure_peer_access(device, peer, &ok));
  if (ok && device != peer) grant_allocator_peer_access(device, peer);
  return ok;
}

const void* cptr(const at::Tensor& t, int64_t offset = 0) {
  return static_cast<const char*>(t.const_data_ptr()) + offset * int64_t(t.element_size());
}

void* mptr(const at::Tensor& t, int64_t offset = 0) {
  return static_cast<char*>(t.data_ptr()) + offset * int64_t(t.element_size());
}

// Segment boundaries of the ring and the direct allreduce's shards: whole
// 64-byte lines, the CPU path's choice too, so for the same tuning both
// backends cut (and therefore sum) identically. 64 is a multiple of the
// kernels' 16-byte packs.
int64_t line_elems(const at::Tensor& t) { return std::max<int64_t>(1, 64 / int64_t(t.element_size())); }

void check_max_sources(const char* op, const char* arg, size_t n) {
  TORCH_CHECK_VALUE(n <= size_t(kMaxReducePtrs), "fastpar.", op, ": ", arg, " has ", n,
                    " tensors but the CUDA reduce kernel reads at most ", kMaxReducePtrs,
                    " sources (one per GPU of a node)");
}

std::vector<c10::DeviceIndex> devices_of(at::TensorList ts) {
  std::vector<c10::DeviceIndex> out;
  for (const auto& t : ts) out.push_back(dev(t));
  return out;
}

// Elements [offset, offset + count) of `t` as a pointer kernels on `device`
// can read: t itself over peer access, else a staging copy on `device`
// enqueued on that device's side stream (kept alive in `temps`).
const void* readable_on(SideStreams& ss, c10::DeviceIndex device, const at::Tensor& t, int64_t offset,
                        int64_t count, std::vector<at::Tensor>& temps) {
  if (peer_ok(device, dev(t))) return cptr(t, offset);
  ++list_op_paths().staging_buffers;
  at::Tensor staging = at::empty({count}, t.options().device(at::kCUDA, device));
  ss.record(staging);
  temps.push_back(staging);
  c10::cuda::CUDAGuard guard(device);
  C10_CUDA_CHECK(cuda_p2p::peer_copy(staging.data_ptr(), device, cptr(t, offset), dev(t),
                                     size_t(count) * t.element_size(), ss.stream(device).stream()));
  return staging.const_data_ptr();
}

void launch_reduce_on(SideStreams& ss, c10::DeviceIndex device, DType dt, ReduceOp op,
                      const std::vector<const void*>& srcs, const std::vector<void*>& dsts, int64_t count,
                      int contributions) {
  TORCH_INTERNAL_ASSERT(srcs.size() <= size_t(kMaxReducePtrs) && dsts.size() <= size_t(kMaxReducePtrs));
  cuda_kernels::ReduceLaunch a;
  for (size_t i = 0; i < srcs.size(); ++i) a.srcs[i] = srcs[i];
  for (size_t i = 0; i < dsts.size(); ++i) a.dsts[i] = dsts[i];
  a.nsrc = int(srcs.size());
  a.ndst = int(dsts.size());
  a.count = count;
  a.contributions = contributions;
  c10::cuda::CUDAGuard guard(device);
  C10_CUDA_CHECK(cuda_kernels::launch_reduce(dt, op, a, ss.stream(device).stream()));
}

// ---------------------------------------------------------------- allreduce

// The device every tensor is on, or -1 when they span several (or, under a
// test device model, tuning.h, when there are several entries).
c10::DeviceIndex common_device(at::TensorList ts) {
  if (tuning().device_model != DeviceModel::kReal && ts.size() > 1) return -1;
  const c10::DeviceIndex d = dev(ts[0]);
  for (const auto& t : ts)
    if (dev(t) != d) return -1;
  return d;
}

// Every entry on one device (k <= kMaxReducePtrs): the whole allreduce is ONE
// launch on that device's current stream, reading all k sources and writing
// all k destinations. No side streams, events or record_stream: the current
// stream already orders it after the producers and before the consumers, and a
// CUDA graph capture records it as one kernel node. Per element it combines
// tensors 0..k-1 in list order, exactly as allreduce_direct's shards do, so the
// bits are the same. Each thread reads element i of every source before it
// writes element i of any destination, so sources may be the destinations.
void allreduce_one_launch(at::TensorList tensors, DType dt, ReduceOp rop, c10::DeviceIndex device) {
  cuda_kernels::ReduceLaunch a;
  const int n = int(tensors.size());
  for (int i = 0; i < n; ++i) {
    a.srcs[i] = tensors[size_t(i)].const_data_ptr();
    a.dsts[i] = tensors[size_t(i)].data_ptr();
  }
  a.nsrc = a.ndst = n;
  a.count = tensors[0].numel();
  a.contributions = n;
  c10::cuda::CUDAGuard guard(device);
  C10_CUDA_CHECK(cuda_kernels::launch_reduce(dt, rop, a, c10::cuda::getCurrentCUDAStream(device).stream()));
}

// The first ordered pair (device, peer) without peer access, or {-1, -1}.
std::pair<c10::DeviceIndex, c10::DeviceIndex> missing_peer_pair(at::TensorList tensors) {
  for (const auto& a : tensors)
    for (const auto& b : tensors)
      if (!peer_ok(dev(a), dev(b))) return {dev(a), dev(b)};
  return {-1, -1};
}

// One pass: device d reduces shard d of every tensor (reading all peers) and
// writes the result into shard d of every tensor. Each shard is computed once,
// so every tensor ends with the same bits; every byte crosses a link once each
// way, and there is a single kernel per device (the latency-optimal choice).
void allreduce_direct(at::TensorList tensors, DType dt, ReduceOp rop) {
  const int n = int(tensors.size());
  const int64_t count = tensors[0].numel();
  const int64_t align = line_elems(tensors[0]);
  SideStreams ss(devices_of(tensors));
  for (const auto& t : tensors) ss.record(t);
  for (int d = 0; d < n; ++d) {
    const Range shard = split_range(0, count, n, d, align);
    if (shard.size() == 0) continue;
    std::vector<const void*> srcs;
    std::vector<void*> dsts;
    for (const auto& t : tensors) {
      srcs.push_back(cptr(t, shard.begin));
      dsts.push_back(mptr(t, shard.begin));
    }
    launch_reduce_on(ss, dev(tensors[size_t(d)]), dt, rop, srcs, dsts, shard.size(), n);
  }
  ss.join();
}

// The ring schedule (core/algorithms/ring_schedule.h), executed by cuda_p2p.
void allreduce_ring(at::TensorList tensors, DType dt, ReduceOp rop) {
  const int n = int(tensors.size());
  const int64_t count = tensors[0].numel();
  const int64_t seg = std::max<int64_t>(1, tuning().ring_segment_bytes / int64_t(tensors[0].element_size()));
  const int64_t span = std::min(seg * n, count);  // accumulator elements: one window
  const int64_t acc_bytes = cuda_p2p::ring_acc_bytes(dt);
  SideStreams ss(devices_of(tensors));
  // One device and n <= 8: the executor reduces segment by segment on the
  // current stream and needs no accumulators (ring_allreduce.h).
  const bool no_acc = n <= kMaxReducePtrs && common_device(tensors) >= 0;
  // Under a test device model (tuning.h) every rank runs on a stream of its
  // own, as ranks on distinct GPUs do, so the executor's events between the
  // ranks' streams run on one GPU too.
  const bool own_streams = tuning().device_model != DeviceModel::kReal;
  std::vector<at::Tensor> temps;
  std::vector<cuda_p2p::RingRank> ranks;
  for (int r = 0; r < n; ++r) {
    const at::Tensor& t = tensors[size_t(r)];
    const at::Tensor& left = tensors[size_t(ring_mod(r - 1, n))];
    const auto opts = at::TensorOptions().dtype(at::kByte).device(t.device());
    if (no_acc) {
      ranks.push_back({int(dev(t)), ss.stream(dev(t)).stream(), t.data_ptr(), nullptr, nullptr});
      continue;
    }
    at::Tensor acc = at::empty({span * acc_bytes}, opts);
    at::Tensor staging;
    if (!peer_ok(dev(t), dev(left))) {
      staging = at::empty({span * acc_bytes}, opts);
      ++list_op_paths().staging_buffers;
    }
    ss.record(t);
    ss.record(acc);
    ss.record(staging);
    const cudaStream_t stream = own_streams ? ss.fork(dev(t)).stream() : ss.stream(dev(t)).stream();
    ranks.push_back({int(dev(t)), stream, t.data_ptr(), acc.data_ptr(), staging.defined() ? staging.data_ptr() : nullptr});
    temps.push_back(acc);
    if (staging.defined()) temps.push_back(staging);
  }
  const cuda_p2p::RingOptions opt{dt, rop, count, seg, line_elems(tensors[0]), tuning().ring_one_launch};
  C10_CUDA_CHECK(cuda_p2p::ring_allreduce(opt, ranks));
  ss.join();
}

void allreduce_cuda(at::TensorList tensors, int64_t op, c10::string_view algorithm) {
  const std::string algo(algorithm);
  const ReduceOp rop = check_allreduce_args(tensors, op, algo);
  const size_t n = tensors.size();
  // Entries may share a device; a device needs no peer access to itself.
  const c10::DeviceIndex one = common_device(tensors);
  if (algo == "direct") {
    TORCH_CHECK_VALUE(n <= size_t(kMaxReducePtrs), "fastpar.allreduce: algorithm 'direct' reduces at most ",
                      kMaxReducePtrs, " tensors, but tensors has ", n, "; use algorithm 'ring'");
    const auto missing = one >= 0 ? std::make_pair(c10::DeviceIndex(-1), c10::DeviceIndex(-1))
                                  : missing_peer_pair(tensors);
    TORCH_CHECK_VALUE(missing.first < 0, "fastpar.allreduce: algorithm 'direct' needs peer access between ",
                      "every pair of devices, but ", dev_str(missing.first), " cannot access ",
                      dev_str(missing.second), "; use algorithm 'ring' (or 'auto', which then picks it)");
  }
  const DType dt = to_dtype("allreduce", "tensors[0]", tensors[0].scalar_type());
  if (n == 1 || tensors[0].numel() == 0) return;  // op over one tensor is the tensor
  const bool direct =
      algo == "direct" ||
      (algo == "auto" && n <= size_t(kMaxReducePtrs) && (one >= 0 || missing_peer_pair(tensors).first < 0));
  if (direct && one >= 0) {
    ++list_op_paths().allreduce_one_launch;
    allreduce_one_launch(tensors, dt, rop, one);
  } else if (direct) {
    ++list_op_paths().allreduce_direct;
    allreduce_direct(tensors, dt, rop);
  } else {
    ++list_op_paths().allreduce_ring;
    allreduce_ring(tensors, dt, rop);
  }
}

// ------------------------------------------------------ reduce, reduce_scatter

void reduce_cuda(at::TensorList inputs, const at::Tensor& output, int64_t op) {
  const ReduceOp rop = check_reduce_args(inputs, output, op);
  check_max_sources("reduce", "inputs", inputs.size());
  const DType dt = to_dtype("reduce", "inputs[0]", inputs[0].scalar_type());
  const int64_t count = inputs[0].numel();
  if (count == 0) return;
  const c10::DeviceIndex o = dev(output);
  std::vector<c10::DeviceIndex> devices = devices_of(inputs);
  devices.push_back(o);
  SideStreams ss(devices);
  for (const auto& t : inputs) ss.record(t);
  ss.record(output);
  std::vector<at::Tensor> temps;
  std::vector<const void*> srcs;
  for (const auto& t : inputs) srcs.push_back(readable_on(ss, o, t, 0, count, temps));
  launch_reduce_on(ss, o, dt, rop, srcs, {output.data_ptr()}, count, int(inputs.size()));
  ss.join();
}

void reduce_scatter_cuda(at::TensorList inputs, at::TensorList outputs, int64_t op) {
  const ReduceOp rop = check_reduce_scatter_args(inputs, outputs, op);
  const int64_t n = int64_t(inputs.size());
  const int64_t m = outputs[0].numel();
  check_max_sources("reduce_scatter", "inputs", inputs.size());
  const DType dt = to_dtype("reduce_scatter", "inputs[0]", inputs[0].scalar_type());
  if (m == 0) return;
  std::vector<c10::DeviceIndex> devices = devices_of(inputs);
  for (auto d : devices_of(outputs)) devices.push_back(d);
  SideStreams ss(devices);
  for (const auto& t : inputs) ss.record(t);
  for (const auto& t : outputs) ss.record(t);
  std::vector<at::Tensor> temps;
  for (int64_t i = 0; i < n; ++i) {
    const at::Tensor& out = outputs[size_t(i)];
    std::vector<const void*> srcs;
    for (const auto& t : inputs) srcs.push_back(readable_on(ss, dev(out), t, i * m, m, temps));
    launch_reduce_on(ss, dev(out), dt, rop, srcs, {out.data_ptr()}, m, int(n));
  }
  ss.join();
}

// ------------------------------------------------ allgather, broadcast, copies

void allgather_cuda(at::TensorList inputs, at::TensorList outputs) {
  check_allgather_args(inputs, outputs);
  const int64_t bytes = inputs[0].numel() * int64_t(inputs[0].element_size());
  if (bytes == 0) return;
  const size_t n = inputs.size();
  std::vector<c10::DeviceIndex> devices = devices_of(inputs);
  for (auto d : devices_of(outputs)) devices.push_back(d);
  SideStreams ss(devices);
  for (const auto& t : inputs) ss.record(t);
  for (const auto& t : outputs) ss.record(t);
  for (size_t j = 0; j < n; ++j) {
    const at::Tensor& out = outputs[j];
    c10::cuda::CUDAGuard guard(dev(out));
    // Output j pulls input j first, then j+1, ...: at any moment the n
    // destinations read n different sources instead of all hitting input 0.
    for (size_t k = 0; k < n; ++k) {
      const size_t i = (j + k) % n;
      C10_CUDA_CHECK(cuda_p2p::peer_copy(static_cast<char*>(out.data_ptr()) + int64_t(i) * bytes, dev(out),
                                         inputs[i].const_data_ptr(), dev(inputs[i]), size_t(bytes),
                                         ss.stream(dev(out)).stream()));
    }
  }
  ss.join();
}

void broadcast_cuda(const at::Tensor& src, at::TensorList outputs) {
  check_tensor_list("broadcast", "outputs", outputs);
  if (src.is_cuda() || !outputs[0].is_cuda()) {
    check_like("broadcast", "tensor", src, "outputs[0]", outputs[0]);
  } else {
    check_like_any_device("broadcast", "tensor", src, "outputs[0]", outputs[0]);
  }
  check_numel("broadcast", "outputs[0]", outputs[0], src.numel(), "the numel of tensor");
  check_no_overlap("broadcast", "outputs", outputs);
  if (src.numel() == 0) return;
  at::Tensor source = src;
  if (!src.is_cuda()) {
    // From host memory (torch.cuda.comm.broadcast allows it): one upload on
    // outputs[0]'s current stream, then device-to-device copies from there,
    // instead of n uploads over the slower host link.
    c10::cuda::CUDAGuard guard(dev(outputs[0]));
    outputs[0].copy_(src);
    source = outputs[0];
  }
  std::vector<c10::DeviceIndex> devices = devices_of(outputs);
  devices.push_back(dev(source));
  SideStreams ss(devices);
  ss.record(source);
  for (const auto& t : outputs) ss.record(t);
  for (const auto& out : outputs) {
    c10::cuda::CUDAGuard guard(dev(out));
    C10_CUDA_CHECK(cuda_p2p::peer_copy(out.data_ptr(), dev(out), source.const_data_ptr(), dev(source),
                                       size_t(source.nbytes()), ss.stream(dev(out)).stream()));
  }
  ss.join();
}

void copy_many_cuda(at::TensorList srcs, at::TensorList dsts) {
  check_copy_many_args(srcs, dsts);
  // Device-to-device copies of contiguous tensors go on side streams, in
  // parallel across devices; anything touching host memory or a strided view
  // (scatter from a CPU tensor, gather along dim != 0) is torch's copy_.
  std::vector<size_t> fast;
  for (size_t i = 0; i < srcs.size(); ++i) {
    if (srcs[i].numel() == 0) continue;
    if (srcs[i].is_cuda() && dsts[i].is_cuda() && srcs[i].is_contiguous() && dsts[i].is_contiguous()) {
      fast.push_back(i);
    } else {
      dsts[i].copy_(srcs[i]);
    }
  }
  if (fast.empty()) return;
  // Each copy runs on its destination's side stream when that device receives
  // only this copy (scatter: one source, many destinations), else on its
  // source's (gather: many sources, one destination), so that both fan out.
  std::vector<c10::DeviceIndex> devices;
  std::vector<int> receives(1024, 0);
  for (size_t i : fast) {
    devices.push_back(dev(srcs[i]));
    devices.push_back(dev(dsts[i]));
    receives[size_t(dev(dsts[i]))] += 1;
  }
  SideStreams ss(devices);
  for (size_t i : fast) {
    ss.record(srcs[i]);
    ss.record(dsts[i]);
  }
  for (size_t i : fast) {
    const c10::DeviceIndex on = receives[size_t(dev(dsts[i]))] == 1 ? dev(dsts[i]) : dev(srcs[i]);
    c10::cuda::CUDAGuard guard(on);
    C10_CUDA_CHECK(cuda_p2p::peer_copy(dsts[i].data_ptr(), dev(dsts[i]), srcs[i].const_data_ptr(),
                                       dev(srcs[i]), size_t(srcs[i].nbytes()), ss.stream(on).stream()));
  }
  ss.join();
}

}  // namespace

TORCH_LIBRARY_IMPL(fastpar, CUDA, m) {
  m.impl("allreduce_", &allreduce_cuda);
  m.impl("reduce_", &reduce_cuda);
  m.impl("reduce_scatter_", &reduce_scatter_cuda);
  m.impl("allgather_", &allgather_cuda);
  m.impl("broadcast_", &broadcast_cuda);
  m.impl("copy_many_", &copy_many_cuda);
}

}  // namespace ops
}  // namespace fastpar
