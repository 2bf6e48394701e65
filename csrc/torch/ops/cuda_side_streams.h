// Side streams for the CUDA ops, one per device an op touches, ordered against
// each device's current stream with events.
//
// Why side streams: an op's work on device d must run concurrently with its
// work on every other device, and must not be serialised behind unrelated work
// the caller queued on a shared stream later; but it must still look to the
// caller exactly like work on the current streams. Hence:
//   * on construction every side stream waits for the current stream of every
//     involved device: a device's kernels read (and write) other devices'
//     tensors, whose producers ran on those devices' current streams;
//   * join() makes every current stream wait for every side stream (a device's
//     tensors are read and written from other devices' side streams too), and
//     every side stream wait for every other one, so that the allocator event
//     record_stream() leaves on side[d] also covers peers' reads of d's memory;
//   * record() calls record_stream on the tensor's own device's side stream, so
//     the caching allocator does not hand its memory out again before that
//     side stream (and, by the joint wait above, every peer) is done with it.
// When an op touches one device only (any number of list entries on cuda:d),
// there is nothing to overlap: the "side" stream is d's current stream, and
// the events and record_stream calls above are all skipped.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>

#include <vector>

namespace fastpar {
namespace ops {

class SideStreams {
 public:
  // `devices` may repeat; each device gets one side stream.
  explicit SideStreams(const std::vector<c10::DeviceIndex>& devices);
  ~SideStreams();
  SideStreams(const SideStreams&) = delete;
  SideStreams& operator=(const SideStreams&) = delete;

  c10::cuda::CUDAStream stream(c10::DeviceIndex device) const;
  const std::vector<c10::DeviceIndex>& devices() const { return devices_; }

  // record_stream on the side stream of t's device (t must be on an involved device).
  void record(const at::Tensor& t) const;

  // Another stream of `device` (not on the current stream), ordered after the
  // work on its side stream so far; join() orders the side streams after it,
  // so record() on the side stream covers it too. For work that must run on
  // streams of its own even on one device: the ring's ranks under a test
  // device model (tuning.h).
  c10::cuda::CUDAStream fork(c10::DeviceIndex device);

  // Orders the current streams (and the side streams among themselves) after
  // all the work enqueued on the side streams. Call once, after the last launch.
  void join();

 private:
  size_t index_of(c10::DeviceIndex device) const;

  std::vector<c10::DeviceIndex> devices_;
  std::vector<c10::cuda::CUDAStream> sides_;
  std::vector<c10::cuda::CUDAStream> forks_;
  bool joined_ = false;
  bool on_current_ = false;  // one device: the side stream is its current stream
};

}  // namespace ops
}  // namespace fastpar
