// A Work that forwards every call to the Work it wraps. The wrappers of a
// call's Work (the profiler's range, call_range.cpp; a call between hosts,
// c10d_engine.h) derive from it and override only what they add.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

namespace fastpar {
namespace distributed {

class ForwardingWork : public c10d::Work {
 public:
  ForwardingWork(c10::intrusive_ptr<c10d::Work> inner, int rank)
      : c10d::Work(rank, inner->retrieveOpType()), inner_(std::move(inner)) {}
  bool isCompleted() override { return inner_->isCompleted(); }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return inner_->result(); }
  void synchronize() override { inner_->synchronize(); }
  bool wait(std::chrono::milliseconds timeout) override { return inner_->wait(timeout); }
  void blockCurrentStream() override { inner_->blockCurrentStream(); }
  void abort() override { inner_->abort(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return inner_->getFuture(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFutureResult() override { return inner_->getFutureResult(); }
  float getDuration() const override { return inner_->getDuration(); }
  uint64_t getSequencenumber() const override { return inner_->getSequencenumber(); }

 protected:
  const c10::intrusive_ptr<c10d::Work> inner_;
};

}  // namespace distributed
}  // namespace fastpar
