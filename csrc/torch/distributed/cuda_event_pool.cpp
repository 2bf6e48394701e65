#include "cuda_event_pool.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "../../core/transport/cuda_p2p/handle_cache.h"

namespace fastpar {
namespace distributed {

PooledEvent PooledEvent::take(c10::DeviceIndex device) {
  cudaEvent_t e = nullptr;
  C10_CUDA_CHECK(cuda_p2p::take_event(device, &e));
  return PooledEvent(device, e);
}

void PooledEvent::give_back() {
  if (event_ != nullptr) cuda_p2p::give_back_event(device_, event_);
  event_ = nullptr;
}

PooledEvent::~PooledEvent() { give_back(); }

PooledEvent& PooledEvent::operator=(PooledEvent&& o) noexcept {
  if (this != &o) {
    give_back();
    device_ = o.device_;
    event_ = o.event_;
    recorded_on_ = o.recorded_on_;
    o.event_ = nullptr;
  }
  return *this;
}

void PooledEvent::record(const c10::cuda::CUDAStream& stream) {
  TORCH_CHECK(event_ != nullptr && stream.device_index() == device_, "fastpar: a pooled CUDA event of cuda:",
              int(device_), " recorded on a stream of cuda:", int(stream.device_index()));
  c10::cuda::CUDAGuard guard(stream.device_index());
  C10_CUDA_CHECK(cudaEventRecord(event_, stream.stream()));
  recorded_on_ = stream.stream();
}

void PooledEvent::block(const c10::cuda::CUDAStream& stream) const {
  if (event_ == nullptr || stream.stream() == recorded_on_) return;
  c10::cuda::CUDAGuard guard(stream.device_index());
  C10_CUDA_CHECK(cudaStreamWaitEvent(stream.stream(), event_, 0));
}

bool PooledEvent::query() const {
  if (event_ == nullptr) return true;
  const cudaError_t err = cudaEventQuery(event_);
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error: clear it
    return false;
  }
  C10_CUDA_CHECK(err);
  return true;
}

void PooledEvent::synchronize() const {
  if (event_ != nullptr) C10_CUDA_CHECK(cudaEventSynchronize(event_));
}

}  // namespace distributed
}  // namespace fastpar
