// CPU tensors with any strides, for the front (backend.cpp).
//
// gloo takes a channels_last activation or a transposed view in any
// collective; fastpar's shared-memory schedules read and write flat memory.
// So the front hands the CPU engines contiguous copies of such tensors and,
// for the tensors a call writes, copies the results back when its Work is done
// (at once: the CPU engines finish before they return). Contiguous tensors,
// the common case, go as they are, without a copy or an allocation. CUDA
// tensors are never staged here: a CUDA engine's route (route.h) sends them
// to NCCL, or refuses them by name where the ranks share a GPU.
// Point to point keeps gloo's and NCCL's rule: contiguous tensors only.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>
#include <ATen/core/Tensor.h>

#include <deque>
#include <memory>
#include <utility>
#include <vector>

namespace fastpar {
namespace distributed {

class Staging {
 public:
  // `t`, or a contiguous copy of it (copied back into `t` by done() when
  // `written`). The references stay valid as long as this object.
  at::Tensor& one(at::Tensor& t, bool written) {
    if (!needs(t)) return t;
    return stage(t, written);
  }
  std::vector<at::Tensor>& list(std::vector<at::Tensor>& ts, bool written) {
    bool any = false;
    for (const at::Tensor& t : ts) any = any || needs(t);
    if (!any) return ts;
    std::vector<at::Tensor>& copy = held().lists.emplace_back(ts);
    for (at::Tensor& t : copy)
      if (needs(t)) t = stage(t, written);
    return copy;
  }
  // A list of lists (all_gather's outputs, gather's on the root, ...).
  std::vector<std::vector<at::Tensor>>& lists(std::vector<std::vector<at::Tensor>>& ls, bool written) {
    bool any = false;
    for (const auto& l : ls)
      for (const at::Tensor& t : l) any = any || needs(t);
    if (!any) return ls;
    std::vector<std::vector<at::Tensor>>& copy = held().nested.emplace_back();
    for (auto& l : ls) copy.push_back(list(l, written));
    return copy;
  }

  // The call's Work, after the written copies are back in the caller's tensors.
  c10::intrusive_ptr<c10d::Work> done(c10::intrusive_ptr<c10d::Work> work) {
    if (!held_ || held_->back.empty()) return work;
    work->wait();
    for (auto& [mine, staged] : held_->back) mine.copy_(staged);
    return work;
  }

 private:
  static bool needs(const at::Tensor& t) { return t.defined() && t.is_cpu() && !t.is_contiguous(); }
  at::Tensor& stage(const at::Tensor& t, bool written) {
    at::Tensor& copy = held().tensors.emplace_back(t.contiguous());
    if (written) held().back.emplace_back(t, copy);
    return copy;
  }

  // deques: what one() and list() return stays where it is as more are added.
  struct Held {
    std::deque<at::Tensor> tensors;
    std::deque<std::vector<at::Tensor>> lists;
    std::deque<std::vector<std::vector<at::Tensor>>> nested;
    std::vector<std::pair<at::Tensor, at::Tensor>> back;  // (the caller's tensor, its staged copy)
  };
  // Made on the first staged tensor: a std::deque allocates when it is
  // constructed, and the common call (contiguous tensors) stages nothing.
  Held& held() {
    if (!held_) held_ = std::make_unique<Held>();
    return *held_;
  }
  std::unique_ptr<Held> held_;
};

}  // namespace distributed
}  // namespace fastpar
