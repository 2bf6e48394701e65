// CUDA events and streams kept from call to call.
//
// Events. Creating an event and destroying it
// are two driver calls on the host path of every call that orders streams on
// several devices (list ops spanning GPUs, the ring's per-rank events, the
// c10d backend's completion events), where the budget is a few microseconds
// (torch's NCCL process group caches its events for the same reason).
//
// One process-wide free list of disable-timing events per device. An event
// is taken for one call and given back when the call no longer records it:
// a cudaStreamWaitEvent already enqueued is bound to the record current at
// the time of the wait, so the next taker's records cannot disturb it.
// The lists are never destroyed (a destructor at exit could run after the
// CUDA runtime is gone; the driver reclaims the events with the process).
//
// Streams. The c10d backend's per-peer p2p streams outlive the backend: the
// caching allocator remembers every stream a tensor was recorded on
// (record_stream) and records an event on each when the tensor is freed,
// which may be after destroy_process_group. A destroyed stream there is an
// invalid handle inside a deleter (the process terminates) or, worse, a
// reused one. So streams are never destroyed; a backend gives its streams
// back and the next one on that device takes them.
// Torch-free; thread-safe.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>
#include <vector>

namespace fastpar {
namespace cuda_p2p {

// A free event of `device`, or a new one created there (the caller's current
// device is restored).
cudaError_t take_event(int device, cudaEvent_t* event);
// Returns an event taken from `device`'s list.
void give_back_event(int device, cudaEvent_t event);

// `count` non-blocking streams of `device`, cached ones first, the rest
// created now one after the other (the caller's current device is restored).
// Taken together because the driver spreads streams over its hardware queues
// (CUDA_DEVICE_MAX_CONNECTIONS, 8 by default) in creation order: streams made
// in one run land on distinct queues, so a kernel spinning on one of them
// never holds up work queued on another (see docs/cuda.md, "Streams").
cudaError_t take_streams(int device, int count, std::vector<cudaStream_t>* streams);
// Returns streams taken from `device`; work still queued on them runs on.
void give_back_streams(int device, const std::vector<cudaStream_t>& streams);

// The events one call takes, given back on every path out.
class CallEvents {
 public:
  CallEvents() = default;
  ~CallEvents() {
    for (const auto& [device, event] : events_) give_back_event(device, event);
  }
  CallEvents(const CallEvents&) = delete;
  CallEvents& operator=(const CallEvents&) = delete;

  // Appends one event of `device`; index i is the i-th taken.
  cudaError_t take(int device) {
    cudaEvent_t e = nullptr;
    const cudaError_t err = take_event(device, &e);
    if (err == cudaSuccess) events_.emplace_back(device, e);
    return err;
  }
  cudaEvent_t operator[](size_t i) const { return events_[i].second; }
  size_t size() const { return events_.size(); }

 private:
  std::vector<std::pair<int, cudaEvent_t>> events_;
};

}  // namespace cuda_p2p
}  // namespace fastpar
