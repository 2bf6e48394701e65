#include "call_range.h"

#include <string>

namespace fastpar {
namespace distributed {

namespace {

// A pending call's Work with its range: the range ends when the Work is first
// seen complete (wait(), synchronize(), isCompleted()), or when it is dropped.
class RangedWork : public c10d::Work {
 public:
  RangedWork(c10::intrusive_ptr<c10d::Work> inner, std::shared_ptr<CallRange::Range> range)
      : c10d::Work(-1, inner->retrieveOpType()), inner_(std::move(inner)), range_(std::move(range)) {}
  bool isCompleted() override {
    const bool done = inner_->isCompleted();
    if (done) end();
    return done;
  }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return inner_->result(); }
  void synchronize() override {
    inner_->synchronize();
    end();
  }
  bool wait(std::chrono::milliseconds timeout) override {
    const bool ok = inner_->wait(timeout);
    end();
    return ok;
  }
  void blockCurrentStream() override { inner_->blockCurrentStream(); }
  void abort() override { inner_->abort(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return inner_->getFuture(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFutureResult() override { return inner_->getFutureResult(); }
  float getDuration() const override { return inner_->getDuration(); }
  uint64_t getSequencenumber() const override { return inner_->getSequencenumber(); }

 private:
  void end() {
    std::lock_guard<std::mutex> g(mu_);
    range_.reset();
  }
  c10::intrusive_ptr<c10d::Work> inner_;
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
