#include "call_range.h"

#include <mutex>
#include <string>

#include "forwarding_work.h"

namespace fastpar {
namespace distributed {

namespace {

// A pending call's Work with its range: the range ends when the Work is first
// seen complete (wait(), synchronize(), isCompleted()), or when it is dropped.
class RangedWork : public ForwardingWork {
 public:
  RangedWork(c10::intrusive_ptr<c10d::Work> inner, std::shared_ptr<CallRange::Range> range)
      : ForwardingWork(std::move(inner), -1), range_(std::move(range)) {}
  bool isCompleted() override {
    const bool done = inner_->isCompleted();
    if (done) end();
    return done;
  }
  void synchronize() override {
    inner_->synchronize();
    end();
  }
  bool wait(std::chrono::milliseconds timeout) override {
    const bool ok = inner_->wait(timeout);
    end();
    return ok;
  }

 private:
  void end() {
    std::lock_guard<std::mutex> g(mu_);
    range_.reset();
  }
  std::mutex mu_;
  std::shared_ptr<CallRange::Range> range_;
};

}  // namespace

CallRange::CallRange(const char* name, const at::Tensor& input) : input_(input) {
#ifdef FASTPAR_WITH_CUDA
  if (input.defined() && input.is_cuda()) {
    nvtx_push((std::string("fastpar:") + name).c_str());
    nvtx_ = true;
  }
#endif
  if (!at::hasCallbacks()) return;  // no profiler: nothing to build
  auto range = std::make_shared<Range>();
  if (!range->fn.isActive()) return;
  if (input.defined()) range->inputs.emplace_back(input);
  range->fn.before(std::string("fastpar:") + name, &range->inputs);
  range_ = std::move(range);
}

CallRange::~CallRange() {
#ifdef FASTPAR_WITH_CUDA
  if (nvtx_) nvtx_pop();
#endif
}

c10::intrusive_ptr<c10d::Work> CallRange::finish(c10::intrusive_ptr<c10d::Work> work) {
  if (!range_) return work;
#ifdef FASTPAR_WITH_CUDA
  // CUDA: the call's work completes on the caller's stream.
  if (input_.defined() && input_.is_cuda()) {
    end_on_stream(input_, std::move(range_));
    return work;
  }
#endif
  if (work->isCompleted()) {
    range_.reset();
    return work;
  }
  return c10::make_intrusive<RangedWork>(std::move(work), std::move(range_));
}

}  // namespace distributed
}  // namespace fastpar
