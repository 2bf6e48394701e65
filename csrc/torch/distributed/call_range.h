// The range torch.profiler shows for each fastpar call, named like gloo's
// ("fastpar:all_reduce", "fastpar:send", ...) with the call's input tensors
// (their shapes with record_shapes=True). It covers the work itself: a call
// that returns complete (the CPU collectives) ends it on return; one that
// returns pending ends it when its Work completes (CPU point to point: at
// wait(); CUDA: when the call's stream reaches it). CUDA calls also carry an
// NVTX range around their enqueue, which Nsight projects onto their kernels.
// Without an active profiler a range costs one check.
#pragma once

#include <ATen/record_function.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <memory>
#include <vector>

namespace fastpar {
namespace distributed {

class CallRange {
 public:
  // `name`: the op as fastpar's messages spell it ("all_reduce"); `input`:
  // the call's tensor (may be undefined: barrier), which must outlive this
  // object (held by reference: no refcount on the call's path).
  CallRange(const char* name, const at::Tensor& input);
  ~CallRange();
  CallRange(const CallRange&) = delete;
  CallRange& operator=(const CallRange&) = delete;

  // The call's Work, the range handed to it where the call is still pending.
  c10::intrusive_ptr<c10d::Work> finish(c10::intrusive_ptr<c10d::Work> work);

  // The profiler's range and the inputs it was given (it keeps a view of them).
  struct Range {
    std::vector<c10::IValue> inputs;
    at::RecordFunction fn{at::RecordScope::USER_SCOPE};
  };

 private:
  std::shared_ptr<Range> range_;  // null: no profiler was recording
  const at::Tensor& input_;
  bool nvtx_ = false;
};

#ifdef FASTPAR_WITH_CUDA
// CUDA's part (cuda_call_range.cpp): an NVTX range pushed and popped on this
// thread, and `range` ended when the current stream of `t`'s device reaches
// the point of this call (at once where no host function can be enqueued).
void nvtx_push(const char* name);
void nvtx_pop();
void end_on_stream(const at::Tensor& t, std::shared_ptr<CallRange::Range> range);
#endif

}  // namespace distributed
}  // namespace fastpar
