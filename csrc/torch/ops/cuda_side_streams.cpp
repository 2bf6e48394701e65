#include "cuda_side_streams.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>

#include "../../core/transport/cuda_p2p/handle_cache.h"
#include "tuning.h"

namespace fastpar {
namespace ops {
namespace {

// Each stream in `waiters` waits for the work enqueued so far on every stream
// in `producers` (one cached event per producer, recorded once; the events go
// back to the cache when the waits are enqueued, which bind to this record).
void wait_all(const std::vector<c10::cuda::CUDAStream>& waiters,
              const std::vector<c10::cuda::CUDAStream>& producers) {
  cuda_p2p::CallEvents events;
  for (const auto& p : producers) {
    C10_CUDA_CHECK(events.take(p.device_index()));
    c10::cuda::CUDAGuard guard(p.device_index());
    C10_CUDA_CHECK(cudaEventRecord(events[events.size() - 1], p.stream()));
  }
  for (const auto& w : waiters) {
    c10::cuda::CUDAGuard guard(w.device_index());
    for (size_t i = 0; i < producers.size(); ++i)
      if (producers[i] != w) C10_CUDA_CHECK(cudaStreamWaitEvent(w.stream(), events[i], 0));
  }
}

std::vector<c10::cuda::CUDAStream> current_streams(const std::vector<c10::DeviceIndex>& devices) {
  std::vector<c10::cuda::CUDAStream> out;
  for (auto d : devices) out.push_back(c10::cuda::getCurrentCUDAStream(d));
  return out;
}

}  // namespace

SideStreams::SideStreams(const std::vector<c10::DeviceIndex>& devices) {
  for (auto d : devices)
    if (std::find(devices_.begin(), devices_.end(), d) == devices_.end()) devices_.push_back(d);
  // One device: nothing runs concurrently with anything else, so the op's work
  // goes on the current stream itself; no events, no record_stream, and a
  // CUDA graph capture records it like any torch op. Not under a test device
  // model (tuning.h), which runs the side streams' path on one GPU.
  if (devices_.size() == 1 && tuning().device_model == DeviceModel::kReal) {
    on_current_ = true;
    sides_.push_back(c10::cuda::getCurrentCUDAStream(devices_[0]));
    return;
  }
  for (auto d : devices_) sides_.push_back(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, d));
  wait_all(sides_, current_streams(devices_));
}

SideStreams::~SideStreams() {
  // Reached without join() only while an exception unwinds after some work was
  // enqueued: still order the current streams after it, so that tensors freed
  // by the unwinding are not reused under running kernels. A second failure
  // here cannot be reported from a destructor; the first one is propagating.
  if (!joined_) {
    try {
      join();
    } catch (...) {
    }
  }
}

size_t SideStreams::index_of(c10::DeviceIndex device) const {
  const auto it = std::find(devices_.begin(), devices_.end(), device);
  TORCH_INTERNAL_ASSERT(it != devices_.end(), "fastpar: no side stream for cuda:", int(device));
  return size_t(it - devices_.begin());
}

c10::cuda::CUDAStream SideStreams::stream(c10::DeviceIndex device) const { return sides_[index_of(device)]; }

void SideStreams::record(const at::Tensor& t) const {
  if (on_current_ || !t.defined() || !t.is_cuda()) return;
  t.record_stream(sides_[index_of(t.device().index())].unwrap());
}

c10::cuda::CUDAStream SideStreams::fork(c10::DeviceIndex device) {
  TORCH_INTERNAL_ASSERT(!on_current_, "fastpar: fork() needs side streams");
  const c10::cuda::CUDAStream side = stream(device);
  forks_.push_back(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device));
  wait_all({forks_.back()}, {side});
  return forks_.back();
}

void SideStreams::join() {
  joined_ = true;
  if (on_current_) return;
  if (!forks_.empty()) wait_all(sides_, forks_);
  wait_all(current_streams(devices_), sides_);
  wait_all(sides_, sides_);
}

}  // namespace ops
}  // namespace fastpar
