// CUDA events reused from call to call, for the c10d backend's Works and
// stream orderings. A c10::cuda::CUDAEvent per call creates its event at the
// first record and destroys it with the Work: two driver calls on every
// collective's host path, which a small all_reduce cannot afford. The events
// come from the process-wide cache of core/transport/cuda_p2p/handle_cache.h
// (shared with the list ops); a PooledEvent takes one and gives it back when
// it dies, on whatever thread that is.
#pragma once

#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>


namespace fastpar {
namespace distributed {

// One event from the cache, held while this object lives (movable, not
// copyable). The same operations as c10::cuda::CUDAEvent's, on its device.
class PooledEvent {
 public:
  PooledEvent() = default;
  // A free event of `device`, or a new one.
  static PooledEvent take(c10::DeviceIndex device);
  ~PooledEvent();
  PooledEvent(PooledEvent&& o) noexcept : device_(o.device_), event_(o.event_), recorded_on_(o.recorded_on_) {
    o.event_ = nullptr;
  }
  PooledEvent& operator=(PooledEvent&& o) noexcept;
  PooledEvent(const PooledEvent&) = delete;
  PooledEvent& operator=(const PooledEvent&) = delete;

  void record(const c10::cuda::CUDAStream& stream);
  // `stream` waits for the work recorded: nothing to enqueue when it is the
  // stream the event was recorded on (stream order already says so).
  void block(const c10::cuda::CUDAStream& stream) const;
  bool query() const;  // true when the recorded work has finished
  void synchronize() const;

 private:
  PooledEvent(c10::DeviceIndex device, cudaEvent_t event) : device_(device), event_(event) {}
  void give_back();

  c10::DeviceIndex device_ = -1;
  cudaEvent_t event_ = nullptr;
  cudaStream_t recorded_on_ = nullptr;
};

}  // namespace distributed
}  // namespace fastpar
