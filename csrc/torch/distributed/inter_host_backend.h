// The inter-host backends of a HierarchicalEngine (its `leaders` and `world`
// groups: gloo or NCCL), seen through a wrapper whose failures are
// torch.distributed.DistBackendError, as the shared-memory engine's are
// (engine.h, run_transport). gloo raises a plain RuntimeError for a peer that is
// gone ("Connection closed by peer") or a timeout, so without this a caller
// that catches DistBackendError to tell a failed collective from a bug would
// see a rank of one host raise DistBackendError (from shared memory) and its
// leader RuntimeError for the same fault. Argument errors (ValueError,
// TypeError, NotImplementedError) keep their type: they are about the call.
// Only the methods HierarchicalEngine calls are forwarded.
#pragma once

#include <c10/util/Exception.h>

#include <string>
#include <utility>
#include <vector>

#include "engine.h"  // c10d::Backend, FASTPAR_TORCH_AT_LEAST

namespace fastpar {
namespace distributed {

// Runs `f`; an error other than an argument error leaves as DistBackendError
// naming `op`, the rank and the inter-host backend.
template <class F>
auto between_hosts(const char* op, int rank, const std::string& backend, F&& f) -> decltype(f()) {
  const auto fail = [&](const char* what) {
    C10_THROW_ERROR(DistBackendError, std::string("fastpar: ") + op + " on rank " + std::to_string(rank) +
                                          " failed between hosts (" + backend + "): " + what);
  };
  try {
    return f();
  } catch (const c10::DistBackendError&) {
    throw;
  } catch (const c10::ValueError&) {
    throw;
  } catch (const c10::TypeError&) {
    throw;
  } catch (const c10::NotImplementedError&) {
    throw;
  } catch (const c10::Error& e) {
    fail(e.what_without_backtrace());
  } catch (const std::exception& e) {
    fail(e.what());
  }
  throw std::logic_error("unreachable");
}

// The Work of an inter-host call: the inner backend's, with wait() and
// synchronize() raising as between_hosts does.
class InterHostWork : public c10d::Work {
 public:
  InterHostWork(c10::intrusive_ptr<c10d::Work> inner, const char* op, int rank, std::string backend)
      : c10d::Work(rank), inner_(std::move(inner)), op_(op), rank_(rank), backend_(std::move(backend)) {}
  bool isCompleted() override { return inner_->isCompleted(); }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return inner_->result(); }
  void synchronize() override {
    between_hosts(op_, rank_, backend_, [&] { inner_->synchronize(); });
  }
  bool wait(std::chrono::milliseconds timeout) override {
    return between_hosts(op_, rank_, backend_, [&] { return inner_->wait(timeout); });
  }
  void blockCurrentStream() override { inner_->blockCurrentStream(); }
  void abort() override { inner_->abort(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return inner_->getFuture(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFutureResult() override { return inner_->getFutureResult(); }
  float getDuration() const override { return inner_->getDuration(); }
  uint64_t getSequencenumber() const override { return inner_->getSequencenumber(); }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  const char* op_;
  int rank_;
  std::string backend_;
};

class InterHostBackend : public c10d::Backend {
 public:
  // `rank`: the rank in the whole group, for messages.
  InterHostBackend(c10::intrusive_ptr<c10d::Backend> inner, int rank)
      : c10d::Backend(inner->getRank(), inner->getSize()), inner_(std::move(inner)), rank_(rank) {}

  const c10::intrusive_ptr<c10d::Backend>& inner() const { return inner_; }
  const std::string getBackendName() const override { return inner_->getBackendName(); }
  void setTimeout(std::chrono::milliseconds timeout) override { inner_->setTimeout(timeout); }
  void shutdown() override { inner_->shutdown(); }
  void abort() override { inner_->abort(); }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override {
    return call("all_reduce", [&] { return inner_->allreduce(tensors, opts); });
  }
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override {
    return call("broadcast", [&] { return inner_->broadcast(tensors, opts); });
  }
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    return call("reduce", [&] { return inner_->reduce(tensors, opts); });
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    return call("all_gather", [&] { return inner_->allgather(outputs, inputs, opts); });
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) override {
    return call("all_gather_into_tensor", [&] { return inner_->_allgather_base(output, input, opts); });
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                     const c10d::ReduceScatterOptions& opts) override {
    return call("reduce_scatter_tensor", [&] { return inner_->_reduce_scatter_base(output, input, opts); });
  }
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    return call("gather", [&] { return inner_->gather(outputs, inputs, opts); });
  }
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    return call("scatter", [&] { return inner_->scatter(outputs, inputs, opts); });
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override {
    return call("all_to_all_single", [&] {
      return inner_->alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    return call("barrier", [&] { return inner_->barrier(opts); });
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override {
    return call("send", [&] { return inner_->send(tensors, dst_rank, tag); });
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override {
    return call("recv", [&] { return inner_->recv(tensors, src_rank, tag); });
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    return call("recv", [&] { return inner_->recvAnysource(tensors, tag); });
  }

 private:
  template <class F>
  c10::intrusive_ptr<c10d::Work> call(const char* op, F&& f) {
    const std::string name = inner_->getBackendName();
    return c10::make_intrusive<InterHostWork>(between_hosts(op, rank_, name, f), op, rank_, name);
  }

  c10::intrusive_ptr<c10d::Backend> inner_;
  int rank_;
};

// `b` behind an InterHostBackend (null stays null).
inline c10::intrusive_ptr<c10d::Backend> inter_host(c10::intrusive_ptr<c10d::Backend> b, int rank) {
  if (!b) return b;
  return c10::make_intrusive<InterHostBackend>(std::move(b), rank);
}

// The backend an InterHostBackend wraps (others as they are).
inline c10::intrusive_ptr<c10d::Backend> unwrapped(const c10::intrusive_ptr<c10d::Backend>& b) {
  if (auto* w = dynamic_cast<InterHostBackend*>(b.get())) return w->inner();
  return b;
}

}  // namespace distributed
}  // namespace fastpar
