#include "cuda_event_pool.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

namespace fastpar {
namespace ops {

PooledEvent::~PooledEvent() {
  if (event_ != nullptr && pool_) pool_->give_back(event_);
}

PooledEvent& PooledEvent::operator=(PooledEvent&& o) noexcept {
  if (this != &o) {
    if (event_ != nullptr && pool_) pool_->give_back(event_);
    pool_ = std::move(o.pool_);
    event_ = o.event_;
    recorded_on_ = o.recorded_on_;
    o.event_ = nullptr;
  }
  return *this;
}

void PooledEvent::record(const c10::cuda::CUDAStream& stream) {
  TORCH_CHECK(event_ != nullptr && stream.device_index() == pool_->device(), "fastpar: a pooled CUDA event of cuda:",
              pool_ ? int(pool_->device()) : -1, " recorded on a stream of cuda:", int(stream.device_index()));
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

EventPool::~EventPool() {
  // Perhaps at process exit, after the driver has gone: errors are ignored.
  for (cudaEvent_t e : free_) cudaEventDestroy(e);
  (void)cudaGetLastError();
}

PooledEvent EventPool::get() {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!free_.empty()) {
      cudaEvent_t e = free_.back();
      free_.pop_back();
      return PooledEvent(shared_from_this(), e);
    }
  }
  c10::cuda::CUDAGuard guard(device_);
  cudaEvent_t e = nullptr;
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return PooledEvent(shared_from_this(), e);
}

void EventPool::give_back(cudaEvent_t event) {
  std::lock_guard<std::mutex> g(mu_);
  free_.push_back(event);
}

}  // namespace ops
}  // namespace fastpar
