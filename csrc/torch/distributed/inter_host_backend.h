// The inter-host backends of a HierarchicalEngine (its `leaders`, `world` and
// `columns` groups: gloo or NCCL), seen through a wrapper that does two things.
//
// Errors: its failures are torch.distributed.DistBackendError, as the
// shared-memory engine's are (engine.h, run_transport). gloo raises a plain
// RuntimeError for a peer that is gone ("Connection closed by peer") or a
// timeout, so without this a caller that catches DistBackendError to tell a
// failed collective from a bug would see a rank of one host raise
// DistBackendError (from shared memory) and its leader RuntimeError for the
// same fault. Argument errors (ValueError, TypeError, NotImplementedError)
// keep their type: they are about the call.
//
// Dtypes: fastpar's shared memory carries every dtype, gloo and NCCL only
// some (gloo's gather, scatter and all_to_all refuse complex, int16, the
// unsigned 16-64 bit and the float8 dtypes with "Invalid scalar type"; NCCL
// has no int16 or complex). So a group spread over hosts would refuse what
// the same group on one host runs. A copy does not look at the values: a
// dense tensor crosses as its bytes. A complex sum is the sum of its real and
// imaginary parts: it crosses as those. Anything else (strided tensors, other
// reductions) crosses as it is and gets the inner backend's result or error.
// The Work reports the caller's tensors, not the views that crossed.
//
// Failures: given the group's failure notice (failure_notice.h), a failed
// call or Work posts its error to the group, and a gloo Work's wait() also
// ends, raising, when another rank's failure is posted first. NCCL's wait()
// does not block the host, so it has nothing to cut short.
//
// Only the methods HierarchicalEngine calls are forwarded.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine.h"  // c10d::Backend, FASTPAR_TORCH_AT_LEAST
#include "failure_notice.h"

namespace fastpar {
namespace distributed {

// An error's message without the "fastpar: " that starts fastpar's own, to
// be quoted in another.
inline std::string cause(const c10::Error& e) {
  std::string why = e.what_without_backtrace();
  const std::string prefix = "fastpar: ";
  if (why.compare(0, prefix.size(), prefix) == 0) why.erase(0, prefix.size());
  return why;
}

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
// synchronize() raising as between_hosts does. `results`, when given, are the
// caller's tensors where views of them crossed: result() and the future's
// value give those.
class InterHostWork : public c10d::Work {
 public:
  // `notice`: the group's, or null.
  InterHostWork(c10::intrusive_ptr<c10d::Work> inner, const char* op, int rank, std::string backend,
                std::shared_ptr<FailureNotice> notice, std::optional<std::vector<at::Tensor>> results = std::nullopt)
      : c10d::Work(rank),
        inner_(std::move(inner)),
        op_(op),
        rank_(rank),
        backend_(std::move(backend)),
        notice_(std::move(notice)),
        results_(std::move(results)) {}
  bool isCompleted() override { return inner_->isCompleted(); }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return results_ ? *results_ : inner_->result(); }
  void synchronize() override {
    posting([&] { between_hosts(op_, rank_, backend_, [&] { inner_->synchronize(); }); });
  }
  bool wait(std::chrono::milliseconds timeout) override {
    if (notice_ && backend_ == "gloo") {
      switch (notice_->wait(*inner_, timeout)) {
        case FailureNotice::Waited::kCompleted:
          break;
        case FailureNotice::Waited::kFailed:
          C10_THROW_ERROR(DistBackendError, std::string("fastpar: ") + op_ + " on rank " + std::to_string(rank_) +
                                                " failed between hosts (" + backend_ +
                                                "): the communicator is unusable after an earlier error: " +
                                                notice_->known().value_or(""));
        case FailureNotice::Waited::kTimedOut:  // the caller's limit: the inner Work raises as it does
          timeout = std::chrono::milliseconds(1);
          break;
      }
    }
    return posting([&] { return between_hosts(op_, rank_, backend_, [&] { return inner_->wait(timeout); }); });
  }
  void blockCurrentStream() override { inner_->blockCurrentStream(); }
  void abort() override { inner_->abort(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    if (!results_) return inner_->getFuture();
    std::lock_guard<std::mutex> lock(future_mu_);
    if (!future_) {  // completes (or fails) with the inner one, holding the caller's tensors
      future_ = inner_->getFuture()->then(
          [results = *results_](c10::ivalue::Future&) { return c10::IValue(results); }, c10::ListType::ofTensors());
    }
    return future_;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFutureResult() override { return inner_->getFutureResult(); }
  float getDuration() const override { return inner_->getDuration(); }
  uint64_t getSequencenumber() const override { return inner_->getSequencenumber(); }

 private:
  // Runs `f`; where it fails because the call failed (not because the
  // caller's own wait limit ran out first), posts the failure.
  template <class F>
  auto posting(F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const c10::DistBackendError& e) {
      if (notice_ && inner_->isCompleted()) notice_->post(cause(e));
      throw;
    }
  }

  c10::intrusive_ptr<c10d::Work> inner_;
  const char* op_;
  int rank_;
  std::string backend_;
  std::shared_ptr<FailureNotice> notice_;
  std::optional<std::vector<at::Tensor>> results_;
  std::mutex future_mu_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// The views that cross between hosts (see the top of this file).
namespace carried {

inline bool dense(const at::Tensor& t) { return t.defined() && !t.is_sparse() && t.is_contiguous(); }

inline bool all_dense(const std::vector<at::Tensor>& ts) {
  return std::all_of(ts.begin(), ts.end(), [](const at::Tensor& t) { return dense(t); });
}

inline bool all_dense(const std::vector<std::vector<at::Tensor>>& tss) {
  return std::all_of(tss.begin(), tss.end(), [](const std::vector<at::Tensor>& ts) { return all_dense(ts); });
}

// A tensor as one dimension of stride 1: a view of a contiguous one (not
// reshape({-1}), which keeps the stride a contiguous tensor of one element may
// have, a step slice's, and view(dtype) refuses it), a copy of another.
inline at::Tensor flat(const at::Tensor& t) {
  return t.is_contiguous() ? t.as_strided({t.numel()}, {1}) : t.reshape({-1});
}

// A tensor's bytes, as a flat uint8 view (a copy where it is not contiguous).
inline at::Tensor bytes(const at::Tensor& t) { return flat(t).view(at::kByte); }

// A complex tensor's real and imaginary parts, as a flat real view.
inline at::Tensor real_parts(const at::Tensor& t) { return at::view_as_real(flat(t)).reshape({-1}); }

template <class F>
std::vector<at::Tensor> map(const std::vector<at::Tensor>& ts, F f) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(f(t));
  return out;
}

template <class F>
std::vector<std::vector<at::Tensor>> map(const std::vector<std::vector<at::Tensor>>& tss, F f) {
  std::vector<std::vector<at::Tensor>> out;
  out.reserve(tss.size());
  for (const auto& ts : tss) out.push_back(map(ts, f));
  return out;
}

// Whether a reduction of `ts` crosses as real parts: a SUM of dense complex
// tensors (AVG is a SUM divided afterwards by the caller of a step).
inline bool summed_as_real(const std::vector<at::Tensor>& ts, const c10d::ReduceOp& op) {
  return op.op_ == c10d::ReduceOp::SUM && !ts.empty() && all_dense(ts) &&
         std::all_of(ts.begin(), ts.end(), [](const at::Tensor& t) { return t.is_complex(); });
}

// all_to_all's split sizes count rows of dim 0; in bytes a row is this many.
inline int64_t row_bytes(const at::Tensor& t) {
  int64_t n = int64_t(t.element_size());
  for (int64_t d = 1; d < t.dim(); ++d) n *= t.size(d);
  return n;
}

// `splits` in bytes: empty splits (equal parts) made explicit. nullopt where
// the rows do not divide among `size` ranks: the inner backend says so.
inline std::optional<std::vector<int64_t>> byte_splits(const at::Tensor& t, const std::vector<int64_t>& splits,
                                                       int size) {
  std::vector<int64_t> out = splits;
  if (out.empty()) {
    if (t.dim() == 0 || t.size(0) % size != 0) return std::nullopt;
    out.assign(size_t(size), t.size(0) / size);
  }
  for (auto& s : out) s *= row_bytes(t);
  return out;
}

}  // namespace carried

class InterHostBackend : public c10d::Backend {
  using Tensors = std::vector<at::Tensor>;

 public:
  // `rank`: the rank in the whole group, for messages. `notice`: the
  // group's failure notice, or null.
  InterHostBackend(c10::intrusive_ptr<c10d::Backend> inner, int rank, std::shared_ptr<FailureNotice> notice)
      : c10d::Backend(inner->getRank(), inner->getSize()),
        inner_(std::move(inner)),
        rank_(rank),
        notice_(std::move(notice)) {}

  const c10::intrusive_ptr<c10d::Backend>& inner() const { return inner_; }
  const std::string getBackendName() const override { return inner_->getBackendName(); }
  void setTimeout(std::chrono::milliseconds timeout) override { inner_->setTimeout(timeout); }
  void shutdown() override { inner_->shutdown(); }
  void abort() override { inner_->abort(); }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override {
    if (!carried::summed_as_real(tensors, opts.reduceOp))
      return call("all_reduce", [&] { return inner_->allreduce(tensors, opts); });
    auto v = carried::map(tensors, carried::real_parts);
    return call("all_reduce", [&] { return inner_->allreduce(v, opts); }, tensors);
  }
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    if (!carried::summed_as_real(tensors, opts.reduceOp))
      return call("reduce", [&] { return inner_->reduce(tensors, opts); });
    auto v = carried::map(tensors, carried::real_parts);
    return call("reduce", [&] { return inner_->reduce(v, opts); }, tensors);
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                     const c10d::ReduceScatterOptions& opts) override {
    if (!carried::summed_as_real({output, input}, opts.reduceOp))
      return call("reduce_scatter_tensor", [&] { return inner_->_reduce_scatter_base(output, input, opts); });
    at::Tensor out = carried::real_parts(output), in = carried::real_parts(input);
    return call(
        "reduce_scatter_tensor", [&] { return inner_->_reduce_scatter_base(out, in, opts); }, Tensors{output});
  }
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override {
    if (!carried::all_dense(tensors)) return call("broadcast", [&] { return inner_->broadcast(tensors, opts); });
    auto v = carried::map(tensors, carried::bytes);
    return call("broadcast", [&] { return inner_->broadcast(v, opts); }, tensors);
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    if (!carried::all_dense(outputs) || !carried::all_dense(inputs))
      return call("all_gather", [&] { return inner_->allgather(outputs, inputs, opts); });
    auto outs = carried::map(outputs, carried::bytes);
    auto ins = carried::map(inputs, carried::bytes);
    return call("all_gather", [&] { return inner_->allgather(outs, ins, opts); }, outputs.at(0));
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) override {
    if (!carried::all_dense({output, input}))
      return call("all_gather_into_tensor", [&] { return inner_->_allgather_base(output, input, opts); });
    at::Tensor out = carried::bytes(output), in = carried::bytes(input);
    return call("all_gather_into_tensor", [&] { return inner_->_allgather_base(out, in, opts); }, Tensors{output});
  }
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    if (!carried::all_dense(outputs) || !carried::all_dense(inputs))
      return call("gather", [&] { return inner_->gather(outputs, inputs, opts); });
    auto outs = carried::map(outputs, carried::bytes);
    auto ins = carried::map(inputs, carried::bytes);
    return call("gather", [&] { return inner_->gather(outs, ins, opts); }, outputs.empty() ? inputs : outputs[0]);
  }
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    if (!carried::all_dense(outputs) || !carried::all_dense(inputs))
      return call("scatter", [&] { return inner_->scatter(outputs, inputs, opts); });
    auto outs = carried::map(outputs, carried::bytes);
    auto ins = carried::map(inputs, carried::bytes);
    return call("scatter", [&] { return inner_->scatter(outs, ins, opts); }, outputs);
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override {
    auto out_splits = carried::byte_splits(output, output_split_sizes, getSize());
    auto in_splits = carried::byte_splits(input, input_split_sizes, getSize());
    if (!carried::all_dense({output, input}) || !out_splits || !in_splits) {
      return call("all_to_all_single", [&] {
        return inner_->alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
      });
    }
    at::Tensor out = carried::bytes(output), in = carried::bytes(input);
    return call(
        "all_to_all_single", [&] { return inner_->alltoall_base(out, in, *out_splits, *in_splits, opts); },
        Tensors{output});
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    return call("barrier", [&] { return inner_->barrier(opts); });
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override {
    if (!carried::all_dense(tensors)) return call("send", [&] { return inner_->send(tensors, dst_rank, tag); });
    auto v = carried::map(tensors, carried::bytes);
    return call("send", [&] { return inner_->send(v, dst_rank, tag); }, tensors);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override {
    if (!carried::all_dense(tensors)) return call("recv", [&] { return inner_->recv(tensors, src_rank, tag); });
    auto v = carried::map(tensors, carried::bytes);
    return call("recv", [&] { return inner_->recv(v, src_rank, tag); }, tensors);
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    if (!carried::all_dense(tensors)) return call("recv", [&] { return inner_->recvAnysource(tensors, tag); });
    auto v = carried::map(tensors, carried::bytes);
    return call("recv", [&] { return inner_->recvAnysource(v, tag); }, tensors);
  }

 private:
  // `results`: the caller's tensors, where views of them crossed.
  template <class F>
  c10::intrusive_ptr<c10d::Work> call(const char* op, F&& f,
                                      std::optional<std::vector<at::Tensor>> results = std::nullopt) {
    const std::string name = inner_->getBackendName();
    return c10::make_intrusive<InterHostWork>(between_hosts(op, rank_, name, f), op, rank_, name, notice_,
                                              std::move(results));
  }

  c10::intrusive_ptr<c10d::Backend> inner_;
  int rank_;
  std::shared_ptr<FailureNotice> notice_;
};

// `b` behind an InterHostBackend (null stays null).
inline c10::intrusive_ptr<c10d::Backend> inter_host(c10::intrusive_ptr<c10d::Backend> b, int rank,
                                                     std::shared_ptr<FailureNotice> notice) {
  if (!b) return b;
  return c10::make_intrusive<InterHostBackend>(std::move(b), rank, std::move(notice));
}

// The backend an InterHostBackend wraps (others as they are).
inline c10::intrusive_ptr<c10d::Backend> unwrapped(const c10::intrusive_ptr<c10d::Backend>& b) {
  if (auto* w = dynamic_cast<InterHostBackend*>(b.get())) return w->inner();
  return b;
}

}  // namespace distributed
}  // namespace fastpar
