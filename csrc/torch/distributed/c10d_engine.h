// C10dEngine: a gloo or NCCL backend behind fastpar's engine interface
// (engine.h). It is the only engine that calls c10d: the CUDA engine's NCCL
// fallback, and a HierarchicalEngine's groups between hosts (`leaders`,
// `world`, `columns`).
//
// Between hosts (`between_hosts`) it adds three things to the inner backend:
// - Errors: a failure is DistBackendError naming the op, the rank and the
//   backend (gloo raises RuntimeError for a lost peer); argument errors keep
//   their type.
// - Dtypes: a dense tensor a call only copies crosses as its bytes and a
//   complex SUM as real parts, so every dtype fastpar's shared memory carries
//   crosses too (gloo and NCCL lack some); the Work reports the caller's
//   tensors, not the views that crossed.
// - The group's failure notice (failure_notice.h): a failed call or Work
//   posts its error, and a gloo Work's wait() ends, raising, when another
//   rank's failure is posted first.
// Otherwise the calls and their Works pass through unchanged.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine.h"
#include "failure_notice.h"
#include "forwarding_work.h"

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

// The Work of a call between hosts: the inner backend's, with wait() and
// synchronize() raising as between_hosts does. `results`, when given, are the
// caller's tensors where views of them crossed: result() and the future's
// value give those.
class InterHostWork : public ForwardingWork {
 public:
  // `notice`: the group's, or null.
  InterHostWork(c10::intrusive_ptr<c10d::Work> inner, const char* op, int rank, std::string backend, std::shared_ptr<FailureNotice> notice,
                std::optional<std::vector<at::Tensor>> results = std::nullopt)
      : ForwardingWork(std::move(inner), rank),
        op_(op),
        rank_(rank),
        backend_(std::move(backend)),
        notice_(std::move(notice)),
        results_(std::move(results)) {}
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
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    if (!results_) return inner_->getFuture();
    std::lock_guard<std::mutex> lock(future_mu_);
    if (!future_) {  // completes (or fails) with the inner one, holding the caller's tensors
      future_ = inner_->getFuture()->then(
          [results = *results_](c10::ivalue::Future&) { return c10::IValue(results); }, c10::ListType::ofTensors());
    }
    return future_;
  }

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

class C10dEngine : public Engine {
  using Tensors = std::vector<at::Tensor>;

 public:
  // `rank`: this rank in the whole group, for messages. `between_hosts`: the
  // additions above; `notice`: the group's failure notice then, or null.
  C10dEngine(c10::intrusive_ptr<c10d::Backend> inner, int rank, bool between_hosts,
             std::shared_ptr<FailureNotice> notice = nullptr)
      : Engine(inner->getRank(), inner->getSize()),
        inner_(std::move(inner)),
        rank_(rank),
        between_hosts_(between_hosts),
        notice_(std::move(notice)) {}
  ~C10dEngine() override { drop_without_gil(inner_); }

  const c10::intrusive_ptr<c10d::Backend>& inner() const { return inner_; }
  void set_timeout(std::chrono::milliseconds timeout) override { inner_->setTimeout(timeout); }
  void shutdown() override { inner_->shutdown(); }
  void abort() override { inner_->abort(); }

  Work all_reduce(at::Tensor& t, const Call& c) override {
    Tensors v{t};
    auto o = with_op<c10d::AllreduceOptions>(c);
    if (!summed_as_real({t}, c)) return call("all_reduce", [&] { return inner_->allreduce(v, o); });
    Tensors parts{carried::real_parts(t)};
    return call("all_reduce", [&] { return inner_->allreduce(parts, o); }, v);
  }
  Work all_reduce_coalesced(std::vector<at::Tensor>& ts, const Call& c) override {
    auto o = with_op<c10d::AllreduceCoalescedOptions>(c);
    return call("all_reduce_coalesced", [&] { return inner_->allreduce_coalesced(ts, o); });
  }
  Work reduce(at::Tensor& t, const Call& c) override {
    Tensors v{t};
    auto o = with_op<c10d::ReduceOptions>(c);
    o.rootRank = c.root;
    if (!summed_as_real({t}, c)) return call("reduce", [&] { return inner_->reduce(v, o); });
    Tensors parts{carried::real_parts(t)};
    return call("reduce", [&] { return inner_->reduce(parts, o); }, v);
  }
  Work reduce_scatter(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins, const Call& c) override {
    auto o = with_op<c10d::ReduceScatterOptions>(c);
    Tensors all = outs;
    all.insert(all.end(), ins.begin(), ins.end());
    if (!summed_as_real(all, c)) return reduce_scatter_as(outs, ins, o, std::nullopt);
    Tensors out_parts = carried::map(outs, carried::real_parts), in_parts = carried::map(ins, carried::real_parts);
    return reduce_scatter_as(out_parts, in_parts, o, outs);
  }
  Work broadcast(at::Tensor& t, const Call& c) override {
    Tensors v{t};
    auto o = timed<c10d::BroadcastOptions>(c);
    o.rootRank = c.root;
    if (!crosses_as_bytes(v)) return call("broadcast", [&] { return inner_->broadcast(v, o); });
    Tensors b{carried::bytes(t)};
    return call("broadcast", [&] { return inner_->broadcast(b, o); }, v);
  }
  Work all_gather(std::vector<at::Tensor>& outs, at::Tensor& in, const Call& c) override {
    auto o = timed<c10d::AllgatherOptions>(c);
    std::vector<Tensors> outputs{outs};
    Tensors inputs{in};
    if (!crosses_as_bytes(outs) || !crosses_as_bytes(inputs))
      return call("all_gather", [&] { return inner_->allgather(outputs, inputs, o); });
    std::vector<Tensors> out_bytes{carried::map(outs, carried::bytes)};
    Tensors in_bytes{carried::bytes(in)};
    return call("all_gather", [&] { return inner_->allgather(out_bytes, in_bytes, o); }, outs);
  }
  Work all_gather_into(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins, const Call& c) override {
    auto o = timed<c10d::AllgatherOptions>(c);
    if (!crosses_as_bytes(outs) || !crosses_as_bytes(ins)) return all_gather_into_as(outs, ins, o, std::nullopt);
    Tensors out_bytes = carried::map(outs, carried::bytes), in_bytes = carried::map(ins, carried::bytes);
    return all_gather_into_as(out_bytes, in_bytes, o, outs);
  }
  Work gather(std::vector<at::Tensor>& outs, at::Tensor& in, const Call& c) override {
    auto o = timed<c10d::GatherOptions>(c);
    o.rootRank = c.root;
    std::vector<Tensors> outputs;
    if (!outs.empty()) outputs.push_back(outs);
    Tensors inputs{in};
    if (!crosses_as_bytes(outs) || !crosses_as_bytes(inputs))
      return call("gather", [&] { return inner_->gather(outputs, inputs, o); });
    std::vector<Tensors> out_bytes;
    if (!outs.empty()) out_bytes.push_back(carried::map(outs, carried::bytes));
    Tensors in_bytes{carried::bytes(in)};
    return call("gather", [&] { return inner_->gather(out_bytes, in_bytes, o); }, outs.empty() ? inputs : outs);
  }
  Work scatter(at::Tensor& out, std::vector<at::Tensor>& ins, const Call& c) override {
    auto o = timed<c10d::ScatterOptions>(c);
    o.rootRank = c.root;
    Tensors outputs{out};
    std::vector<Tensors> inputs;
    if (!ins.empty()) inputs.push_back(ins);
    if (!crosses_as_bytes(outputs) || !crosses_as_bytes(ins))
      return call("scatter", [&] { return inner_->scatter(outputs, inputs, o); });
    Tensors out_bytes{carried::bytes(out)};
    std::vector<Tensors> in_bytes;
    if (!ins.empty()) in_bytes.push_back(carried::map(ins, carried::bytes));
    return call("scatter", [&] { return inner_->scatter(out_bytes, in_bytes, o); }, outputs);
  }
  Work all_to_all(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits, std::vector<int64_t>& in_splits,
                  const Call& c) override {
    auto o = timed<c10d::AllToAllOptions>(c);
    std::optional<std::vector<int64_t>> out_b, in_b;
    if (between_hosts_) {
      out_b = carried::byte_splits(out, out_splits, size());
      in_b = carried::byte_splits(in, in_splits, size());
    }
    if (!out_b || !in_b || !crosses_as_bytes({out, in}))
      return call("all_to_all_single", [&] { return inner_->alltoall_base(out, in, out_splits, in_splits, o); });
    at::Tensor out_bytes = carried::bytes(out), in_bytes = carried::bytes(in);
    return call(
        "all_to_all_single", [&] { return inner_->alltoall_base(out_bytes, in_bytes, *out_b, *in_b, o); },
        Tensors{out});
  }
  Work barrier(const Call& c) override {
    auto o = timed<c10d::BarrierOptions>(c);
    if (c.device >= 0) o.device_ids = {c.device};
    return call("barrier", [&] { return inner_->barrier(o); });
  }
  Work send(at::Tensor& t, int peer, int tag) override {
    Tensors v{t};
    if (!crosses_as_bytes(v)) return call("send", [&] { return inner_->send(v, peer, tag); });
    Tensors b{carried::bytes(t)};
    return call("send", [&] { return inner_->send(b, peer, tag); }, v);
  }
  Work recv(at::Tensor& t, int peer, int tag) override {
    Tensors v{t};
    const bool as_bytes = crosses_as_bytes(v);
    Tensors used = as_bytes ? Tensors{carried::bytes(t)} : v;
    std::optional<Tensors> results;
    if (as_bytes) results = v;
    if (peer < 0) return call("recv", [&] { return inner_->recvAnysource(used, tag); }, results);
    return call("recv", [&] { return inner_->recv(used, peer, tag); }, results);
  }

 private:
  // The caller's reduction as c10d names it (engine.h: Call).
  static c10d::ReduceOp torch_op(const Call& c) {
    if (c.foreign && c.torch_op) return *c.torch_op;
    return c10d::ReduceOp(static_cast<c10d::ReduceOp::RedOpType>(int(c.op)));
  }
  // c10d's options of a call: its timeout (unset: the inner backend's own).
  template <class O>
  static O timed(const Call& c) {
    O o;
    o.timeout = c.timeout.count() > 0 ? c.timeout : c10d::kUnsetTimeout;
    return o;
  }
  template <class O>
  static O with_op(const Call& c) {
    O o = timed<O>(c);
    o.reduceOp = torch_op(c);
    return o;
  }
  bool crosses_as_bytes(const Tensors& ts) const { return between_hosts_ && carried::all_dense(ts); }
  // A SUM of dense complex tensors crosses as real parts (AVG is a SUM the
  // caller of a step divides afterwards).
  bool summed_as_real(const Tensors& ts, const Call& c) const {
    return between_hosts_ && !c.foreign && c.op == ReduceOp::SUM && !ts.empty() && carried::all_dense(ts) &&
           std::all_of(ts.begin(), ts.end(), [](const at::Tensor& t) { return t.is_complex(); });
  }
  Work reduce_scatter_as(Tensors& outs, Tensors& ins, c10d::ReduceScatterOptions& o,
                         std::optional<Tensors> results) {
    if (outs.size() == 1)
      return call("reduce_scatter_tensor", [&] { return inner_->_reduce_scatter_base(outs[0], ins[0], o); }, results);
    return call("reduce_scatter_tensor_coalesced",
                [&] { return inner_->reduce_scatter_tensor_coalesced(outs, ins, o); }, results);
  }
  Work all_gather_into_as(Tensors& outs, Tensors& ins, c10d::AllgatherOptions& o, std::optional<Tensors> results) {
    if (outs.size() == 1)
      return call("all_gather_into_tensor", [&] { return inner_->_allgather_base(outs[0], ins[0], o); }, results);
    return call("all_gather_into_tensor_coalesced",
                [&] { return inner_->allgather_into_tensor_coalesced(outs, ins, o); }, results);
  }
  // Between hosts: the inner call under between_hosts, its Work an
  // InterHostWork. Otherwise the inner call and Work as they are.
  template <class F>
  Work call(const char* op, F&& f, std::optional<Tensors> results = std::nullopt) {
    if (!between_hosts_) return f();
    const std::string name = inner_->getBackendName();
    return c10::make_intrusive<InterHostWork>(between_hosts(op, rank_, name, f), op, rank_, name, notice_,
                                              std::move(results));
  }

  c10::intrusive_ptr<c10d::Backend> inner_;
  int rank_;
  bool between_hosts_;
  std::shared_ptr<FailureNotice> notice_;
};

// `b` as an engine (null stays null).
inline c10::intrusive_ptr<C10dEngine> c10d_engine(c10::intrusive_ptr<c10d::Backend> b, int rank, bool between_hosts,
                                                  std::shared_ptr<FailureNotice> notice = nullptr) {
  if (!b) return nullptr;
  return c10::make_intrusive<C10dEngine>(std::move(b), rank, between_hosts, std::move(notice));
}

// The backend a C10dEngine runs on, or null for another engine.
inline c10::intrusive_ptr<c10d::Backend> inner_backend(const c10::intrusive_ptr<Engine>& e) {
  if (auto* w = dynamic_cast<C10dEngine*>(e.get())) return w->inner();
  return nullptr;
}

}  // namespace distributed
}  // namespace fastpar
