#include "backend.h"

#include <numeric>

#include "../../core/transport/cpu_shm/shm_segment.h"  // kSegmentPrefix
#include "../dtypes.h"  // to_dtype
#include "bindings.h"
#include "call_range.h"
#include "checks.h"
#include "engine.h"
#include "staging.h"

namespace fastpar {
namespace distributed {

namespace {

// The Work endCoalescing returns: every call of the block, waited in order.
class CoalescedWork : public c10d::Work {
 public:
  explicit CoalescedWork(std::vector<c10::intrusive_ptr<c10d::Work>> works) : Work(-1, c10d::OpType::COALESCED), works_(std::move(works)) {}
  bool isCompleted() override {
    for (auto& w : works_)
      if (!w->isCompleted()) return false;
    return true;
  }
  bool isSuccess() const override {
    for (const auto& w : works_)
      if (!w->isSuccess()) return false;
    return true;
  }
  bool wait(std::chrono::milliseconds timeout) override {
    for (auto& w : works_) w->wait(timeout);
    return true;
  }
  std::vector<at::Tensor> result() override {
    std::vector<at::Tensor> all;
    for (auto& w : works_) {
      auto r = w->result();
      all.insert(all.end(), r.begin(), r.end());
    }
    return all;
  }

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
};

// A call of a coalescing block that raised DistBackendError (a failed peer or
// communicator): complete, with that error, which wait() raises.
class FailedWork : public c10d::Work {
 public:
  explicit FailedWork(std::exception_ptr error) : Work(-1, c10d::OpType::UNKNOWN) { finish(std::move(error)); }
};

}  // namespace

// The Call of a reducing c10d call: its op as the element math names it, or
// marked foreign (PREMUL_SUM, which only NCCL runs) with torch's kept.
static Call reducing_call(const c10d::ReduceOp& op, std::chrono::milliseconds timeout, int64_t root = 0) {
  Call c = Call::rooted(int(root), timeout);
  c.torch_op = &op;
  const int v = int(op.op_);
  c.foreign = v < 0 || v > int(ReduceOp::BXOR);
  if (!c.foreign) c.op = ReduceOp(v);
  return c;
}

Backend::Backend(int rank, int size, std::chrono::milliseconds timeout, c10::intrusive_ptr<ShmEngine> shm,
                 c10::intrusive_ptr<HierarchicalEngine> hierarchical, c10::intrusive_ptr<Engine> cuda)
    : c10d::Backend(rank, size),
      timeout_(timeout),
      shm_(std::move(shm)),
      cpu_hier_(std::move(hierarchical)),
      cuda_(std::move(cuda)) {
  TORCH_CHECK_VALUE(shm_, "fastpar: Backend needs a ShmEngine (shm is None)");
  if (cpu_hier_) {
    TORCH_CHECK_VALUE(cpu_hier_->local().get() == shm_.get(),
                      "fastpar: hierarchical's local engine is not shm (it must run over this host's ShmEngine)");
    TORCH_CHECK_VALUE(cpu_hier_->rank() == rank && cpu_hier_->size() == size, "fastpar: hierarchical is rank ",
                      cpu_hier_->rank(), " of ", cpu_hier_->size(), " but the group's rank is ", rank, " of ", size);
  } else {
    TORCH_CHECK_VALUE(shm_->size() == size, "fastpar: shm has ", shm_->size(), " ranks but the group has ", size,
                      " (a group over several hosts needs hierarchical)");
  }
}

Backend::~Backend() { drop_without_gil(cuda_, cpu_hier_, shm_); }

c10::intrusive_ptr<c10d::Backend::Options> Backend::getBackendOptions() {
  return c10::make_intrusive<Options>("fastpar", timeout_);
}

void Backend::setTimeout(std::chrono::milliseconds timeout) {
  timeout_ = timeout;
  cpu_engine().set_timeout(timeout);
  if (cuda_) cuda_->set_timeout(timeout);
}

void Backend::shutdown() {
  if (cuda_) cuda_->shutdown();
  cpu_engine().shutdown();
}

void Backend::abort() {
  if (cuda_) cuda_->abort();
}

Engine& Backend::engine_for(const char* op, const std::string& name, const at::Tensor& t) {
  if (t.is_cpu()) return cpu_engine();
  TORCH_CHECK_VALUE(cuda_, "fastpar.", op, ": ", name, " is on device '", t.device().str(),
                    "' but this group has no fastpar CUDA backend (fastpar built without CUDA, or no GPU when the "
                    "group was created; use \"cpu:fastpar,cuda:nccl\")");
  return *cuda_;
}

template <class F>
Work Backend::dispatch(const char* op, const std::string& name, const at::Tensor& t, F&& call) {
  Staging s;
  return record(op, t, [&] { return s.done(call(engine_for(op, name, t), s)); });
}

// Inside a coalescing block a failure is not raised at the call: torch's
// coalescing manager (batch_isend_irecv, _coalescing_manager) leaves the
// group's op list behind when its block raises, and from then on torch
// issues none of that group's calls (a sync collective returns having done
// nothing, an async one an _IllegalWork). The failed call's Work carries the
// error instead, and the block's Work (endCoalescing) raises it at wait().
// Argument errors are raised at once, as everywhere.
template <class F>
Work Backend::record(const char* op, const at::Tensor& input, F&& call) {
  CallRange range(op, input);
  Work work;
  try {
    work = range.finish(call());
  } catch (const c10::DistBackendError&) {
    std::lock_guard<std::mutex> g(coalescing_mu_);
    if (!coalesced_) throw;
    work = c10::make_intrusive<FailedWork>(std::current_exception());
  }
  ++calls_;
  std::lock_guard<std::mutex> g(coalescing_mu_);
  if (coalesced_) coalesced_->push_back(work);
  return work;
}

void Backend::startCoalescing() {
  std::lock_guard<std::mutex> g(coalescing_mu_);
  TORCH_CHECK(!coalesced_, "fastpar: startCoalescing called twice without endCoalescing");
  coalesced_.emplace();
}

Work Backend::endCoalescing() {
  std::lock_guard<std::mutex> g(coalescing_mu_);
  TORCH_CHECK(coalesced_, "fastpar: endCoalescing called without startCoalescing");
  auto works = std::move(*coalesced_);
  coalesced_.reset();
  return c10::make_intrusive<CoalescedWork>(std::move(works));
}

// ---------------------------------------------------------------- collectives

Work Backend::allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  checks::one("all_reduce", "tensors", tensors.size());
  if (tensors[0].defined() && tensors[0].is_sparse()) return allreduce_sparse(tensors, opts);
  checks::tensor("all_reduce", "tensors[0]", tensors[0]);
  checks::reducible("all_reduce", opts.reduceOp, "tensors[0]", tensors[0]);
  return dispatch("all_reduce", "tensors[0]", tensors[0], [&](Engine& e, Staging& s) {
    return e.all_reduce(s.one(tensors[0], true), reducing_call(opts.reduceOp, opts.timeout));
  });
}

// Every rank's entry count, then its indices and values padded to the largest
// count, in one all_gather each; summed in rank order.
Work Backend::allreduce_sparse(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  const char* op = "all_reduce";
  checks::one(op, "tensors", tensors.size());
  at::Tensor& t = tensors[0];
  TORCH_CHECK_VALUE(t.defined() && t.is_sparse(), "fastpar.", op, ": tensors[0] is not a sparse COO tensor");
  TORCH_CHECK_VALUE(opts.reduceOp == c10d::ReduceOp::SUM, "fastpar.", op, ": sparse tensors reduce with "
                    "ReduceOp.SUM only, got ReduceOp value ", int(opts.reduceOp.op_));
  return record(op, t, [&] {
    Engine& e = engine_for(op, "tensors[0]", t);
    const int n = getSize();
    const Call c = Call::rooted(0, opts.timeout);
    const at::Tensor mine = t.coalesce();
    const auto i64 = at::TensorOptions().dtype(at::kLong).device(t.device());
    auto gather_into = [&](const at::Tensor& out, const at::Tensor& in) {
      std::vector<at::Tensor> outs{out}, ins{in};
      e.all_gather_into(outs, ins, c)->wait();
    };
    at::Tensor counts = at::empty({n}, i64);
    gather_into(counts, at::full({1}, mine._nnz(), i64));
    const at::Tensor host_counts = counts.cpu();
    const int64_t most = host_counts.max().item<int64_t>();
    auto padded = [&](const at::Tensor& x, int64_t dim) {
      std::vector<int64_t> sizes = x.sizes().vec();
      sizes[dim] = most;
      at::Tensor p = at::zeros(sizes, x.options());
      p.narrow(dim, 0, x.size(dim)).copy_(x);
      return p;
    };
    at::Tensor idx = padded(mine._indices(), 1), val = padded(mine._values(), 0);
    std::vector<int64_t> idx_all = idx.sizes().vec(), val_all = val.sizes().vec();
    idx_all.insert(idx_all.begin(), n);
    val_all.insert(val_all.begin(), n);
    at::Tensor idxs = at::empty(idx_all, idx.options()), vals = at::empty(val_all, val.options());
    gather_into(idxs, idx);
    gather_into(vals, val);
    at::Tensor sum;
    for (int r = 0; r < n; ++r) {
      const int64_t k = host_counts[r].item<int64_t>();
      at::Tensor part = at::sparse_coo_tensor(idxs[r].narrow(1, 0, k), vals[r].narrow(0, 0, k), t.sizes());
      sum = r == 0 ? part : sum + part;
    }
    t.copy_(sum.coalesce());
    return enqueued_work(tensors);
  });
}

Work Backend::allreduce_coalesced(std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK_VALUE(!tensors.empty(), "fastpar.all_reduce_coalesced: tensors is an empty list");
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string name = indexed("tensors", i);
    checks::tensor("all_reduce_coalesced", name, tensors[i]);
    checks::like("all_reduce_coalesced", name, tensors[i], "tensors[0]", tensors[0], tensors[i].numel(), "");
    checks::reducible("all_reduce_coalesced", opts.reduceOp, name, tensors[i]);
  }
  return dispatch("all_reduce_coalesced", "tensors[0]", tensors[0], [&](Engine& e, Staging& s) {
    return e.all_reduce_coalesced(s.list(tensors, true), reducing_call(opts.reduceOp, opts.timeout));
  });
}

Work Backend::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  checks::one("broadcast", "tensors", tensors.size());
  checks::tensor("broadcast", "tensors[0]", tensors[0]);
  checks::root("broadcast", opts.rootRank, getSize());
  return dispatch("broadcast", "tensors[0]", tensors[0], [&](Engine& e, Staging& s) {
    return e.broadcast(s.one(tensors[0], true), Call::rooted(int(opts.rootRank), opts.timeout));
  });
}

Work Backend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  checks::one("reduce", "tensors", tensors.size());
  checks::tensor("reduce", "tensors[0]", tensors[0]);
  checks::reducible("reduce", opts.reduceOp, "tensors[0]", tensors[0]);
  checks::root("reduce", opts.rootRank, getSize());
  return dispatch("reduce", "tensors[0]", tensors[0], [&](Engine& e, Staging& s) {
    return e.reduce(s.one(tensors[0], true), reducing_call(opts.reduceOp, opts.timeout, opts.rootRank));
  });
}

Work Backend::allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                        const c10d::AllgatherOptions& opts) {
  checks::one("all_gather", "input_tensors", inputs.size());
  checks::one("all_gather", "output_tensors", outputs.size());
  at::Tensor& in = inputs[0];
  checks::tensor("all_gather", "input_tensors[0]", in);
  checks::per_rank("all_gather", "output_tensors[0]", outputs[0], getSize(), "input_tensors[0]", in, in.numel());
  return dispatch("all_gather", "input_tensors[0]", in, [&](Engine& e, Staging& s) {
    return e.all_gather(s.list(outputs[0], true), s.one(in, false), Call::rooted(0, opts.timeout));
  });
}

Work Backend::_allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  checks::tensor("all_gather_into_tensor", "input_tensor", input);
  checks::tensor("all_gather_into_tensor", "output_tensor", output);
  checks::like("all_gather_into_tensor", "output_tensor", output, "input_tensor", input, input.numel() * getSize(),
               "world size x input_tensor's elements");
  return dispatch("all_gather_into_tensor", "input_tensor", input, [&](Engine& e, Staging& s) {
    std::vector<at::Tensor> outs{s.one(output, true)}, ins{s.one(input, false)};
    return e.all_gather_into(outs, ins, Call::rooted(0, opts.timeout));
  });
}

// output_tensor_lists[r][i] receives rank r's input_tensor_list[i] (as
// gloo's): one all_gather per entry.
Work Backend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                  const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather_coalesced";
  TORCH_CHECK_VALUE(!inputs.empty(), "fastpar.", op, ": input_tensor_list is an empty list");
  TORCH_CHECK_VALUE(outputs.size() == size_t(getSize()), "fastpar.", op, ": output_tensor_lists has ",
                    outputs.size(), " lists but the group has ", getSize(), " ranks (one list per rank)");
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string in = indexed("input_tensor_list", i);
    checks::tensor(op, in, inputs[i]);
    checks::like(op, in, inputs[i], "input_tensor_list[0]", inputs[0], inputs[i].numel(), "");
  }
  for (size_t r = 0; r < outputs.size(); ++r) {
    const std::string list = indexed("output_tensor_lists", r);
    checks::pairs(op, outputs[r].size(), inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      const std::string out = indexed(list, i);
      checks::tensor(op, out, outputs[r][i]);
      checks::like(op, out, outputs[r][i], indexed("input_tensor_list", i), inputs[i], inputs[i].numel(),
                   "the same number of elements as input_tensor_list[" + std::to_string(i) + "]");
    }
  }
  return dispatch(op, "input_tensor_list[0]", inputs[0], [&](Engine& e, Staging& s) {
    std::vector<std::vector<at::Tensor>>& outs = s.lists(outputs, true);
    std::vector<at::Tensor>& ins = s.list(inputs, false);
    const Call c = Call::rooted(0, opts.timeout);
    for (size_t i = 0; i < ins.size(); ++i) {
      std::vector<at::Tensor> entry;
      for (auto& list : outs) entry.push_back(list[i]);
      e.all_gather(entry, ins[i], c)->wait();
    }
    std::vector<at::Tensor> all;
    for (const auto& list : outs) all.insert(all.end(), list.begin(), list.end());
    return enqueued_work(std::move(all));
  });
}

Work Backend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                              const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather_into_tensor_coalesced";
  checks::coalesced_flat(op, outputs, inputs, /*small_is_output=*/false, getSize(), nullptr);
  return dispatch(op, "inputs[0]", inputs[0], [&](Engine& e, Staging& s) {
    return e.all_gather_into(s.list(outputs, true), s.list(inputs, false), Call::rooted(0, opts.timeout));
  });
}

Work Backend::gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                     const c10d::GatherOptions& opts) {
  checks::one("gather", "input_tensors", inputs.size());
  checks::tensor("gather", "input_tensors[0]", inputs[0]);
  checks::root_lists("gather", "output_tensors", outputs, getRank(), int(opts.rootRank), getSize(),
                     "input_tensors[0]", inputs[0]);
  return dispatch("gather", "input_tensors[0]", inputs[0], [&](Engine& e, Staging& s) {
    std::vector<at::Tensor> none;
    std::vector<at::Tensor>& outs = outputs.empty() ? none : s.list(outputs[0], true);
    return e.gather(outs, s.one(inputs[0], false), Call::rooted(int(opts.rootRank), opts.timeout));
  });
}

#if FASTPAR_TORCH_AT_LEAST(2, 14)
// gather into one flat tensor on the root: gather into its rows.
Work Backend::gather_into_tensor(at::Tensor& output, at::Tensor& input, const c10d::GatherOptions& opts) {
  checks::tensor("gather_into_tensor", "input", input);
  checks::root("gather_into_tensor", opts.rootRank, getSize());
  const bool root = getRank() == opts.rootRank;
  if (root) {
    checks::tensor("gather_into_tensor", "output", output);
    checks::like("gather_into_tensor", "output", output, "input", input, input.numel() * getSize(),
                 "world size x input's elements");
  }
  return dispatch("gather_into_tensor", "input", input, [&](Engine& e, Staging& s) {
    std::vector<at::Tensor> rows;
    if (root) {
      at::Tensor& out = s.one(output, true);
      for (int q = 0; q < getSize(); ++q) rows.push_back(rank_block(out, input.numel(), q));
    }
    at::Tensor in = s.one(input, false).reshape({-1});
    e.gather(rows, in, Call::rooted(int(opts.rootRank), opts.timeout))->wait();
    return enqueued_work({output});
  });
}
#endif

Work Backend::scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                      const c10d::ScatterOptions& opts) {
  checks::one("scatter", "output_tensors", outputs.size());
  checks::tensor("scatter", "output_tensors[0]", outputs[0]);
  checks::root_lists("scatter", "input_tensors", inputs, getRank(), int(opts.rootRank), getSize(),
                     "output_tensors[0]", outputs[0]);
  return dispatch("scatter", "output_tensors[0]", outputs[0], [&](Engine& e, Staging& s) {
    std::vector<at::Tensor> none;
    std::vector<at::Tensor>& ins = inputs.empty() ? none : s.list(inputs[0], false);
    return e.scatter(s.one(outputs[0], true), ins, Call::rooted(int(opts.rootRank), opts.timeout));
  });
}

// The list form: the inputs packed into one flat tensor.
Work Backend::reduce_scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                             const c10d::ReduceScatterOptions& opts) {
  checks::one("reduce_scatter", "output", outputs.size());
  checks::one("reduce_scatter", "input_list", inputs.size());
  checks::tensor("reduce_scatter", "output", outputs[0]);
  checks::reducible("reduce_scatter", opts.reduceOp, "output", outputs[0]);
  checks::per_rank("reduce_scatter", "input_list[0]", inputs[0], getSize(), "output", outputs[0],
                   outputs[0].numel());
  return dispatch("reduce_scatter", "output", outputs[0], [&](Engine& e, Staging& s) {
    std::vector<at::Tensor> outs{s.one(outputs[0], true)}, ins{at::cat(inputs[0])};
    e.reduce_scatter(outs, ins, reducing_call(opts.reduceOp, opts.timeout))->wait();
    return enqueued_work(outputs);
  });
}

Work Backend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  checks::tensor("reduce_scatter_tensor", "output", output);
  checks::tensor("reduce_scatter_tensor", "input", input);
  checks::like("reduce_scatter_tensor", "input", input, "output", output, output.numel() * getSize(),
               "world size x output's elements");
  checks::reducible("reduce_scatter_tensor", opts.reduceOp, "output", output);
  return dispatch("reduce_scatter_tensor", "output", output, [&](Engine& e, Staging& s) {
    std::vector<at::Tensor> outs{s.one(output, true)}, ins{s.one(input, false)};
    return e.reduce_scatter(outs, ins, reducing_call(opts.reduceOp, opts.timeout));
  });
}

Work Backend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                              const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter_tensor_coalesced";
  checks::coalesced_flat(op, outputs, inputs, /*small_is_output=*/true, getSize(), &opts.reduceOp);
  return dispatch(op, "outputs[0]", outputs[0], [&](Engine& e, Staging& s) {
    return e.reduce_scatter(s.list(outputs, true), s.list(inputs, false), reducing_call(opts.reduceOp, opts.timeout));
  });
}

Work Backend::alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
                            std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all_single";
  checks::tensor(op, "input", input);
  checks::tensor(op, "output", output);
  checks::like(op, "output", output, "input", input, output.numel(), "");
  TORCH_CHECK_VALUE(checks::row_elems(input) == checks::row_elems(output) || input.numel() == 0 ||
                        output.numel() == 0,
                    "fastpar.", op, ": input rows have ", checks::row_elems(input), " elements but output rows have ",
                    checks::row_elems(output));
  const auto sends = checks::splits("input", input_split_sizes, input, getSize());
  const auto expects = checks::splits("output", output_split_sizes, output, getSize());
  checks::own_block(op, sends[getRank()] * int64_t(input.element_size()),
                    expects[getRank()] * int64_t(output.element_size()));
  return dispatch(op, "input", input, [&](Engine& e, Staging& s) {
    return e.all_to_all(s.one(output, true), s.one(input, false), output_split_sizes, input_split_sizes,
                        Call::rooted(0, opts.timeout));
  });
}

// The list form: packed into one all_to_all_single with split sizes.
Work Backend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                       const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all";
  const int n = getSize();
  TORCH_CHECK_VALUE(int(inputs.size()) == n, "fastpar.", op, ": input_tensor_list has ", inputs.size(),
                    " tensors but the group has ", n, " ranks");
  TORCH_CHECK_VALUE(int(outputs.size()) == n, "fastpar.", op, ": output_tensor_list has ", outputs.size(),
                    " tensors but the group has ", n, " ranks");
  for (int q = 0; q < n; ++q) {
    const std::string in = indexed("input_tensor_list", q), out = indexed("output_tensor_list", q);
    checks::tensor(op, in, inputs[q]);
    checks::tensor(op, out, outputs[q]);
    checks::like(op, in, inputs[q], "input_tensor_list[0]", inputs[0], inputs[q].numel(), "");
    checks::like(op, out, outputs[q], "input_tensor_list[0]", inputs[0], outputs[q].numel(), "");
  }
  checks::own_block(op, int64_t(inputs[getRank()].nbytes()), int64_t(outputs[getRank()].nbytes()));
  return dispatch(op, "input_tensor_list[0]", inputs[0], [&](Engine& e, Staging&) {
    std::vector<at::Tensor> flat_in;
    std::vector<int64_t> send, recv;
    for (int q = 0; q < n; ++q) {
      flat_in.push_back(inputs[q].reshape({-1}));
      send.push_back(inputs[q].numel());
      recv.push_back(outputs[q].numel());
    }
    at::Tensor packed_in = at::cat(flat_in);
    at::Tensor packed_out = at::empty({std::accumulate(recv.begin(), recv.end(), int64_t(0))}, packed_in.options());
    // Copies: some backends leave the split vectors they are given moved-from.
    std::vector<int64_t> recv_arg = recv, send_arg = send;
    e.all_to_all(packed_out, packed_in, recv_arg, send_arg, Call::rooted(0, opts.timeout))->wait();
    int64_t off = 0;
    for (int q = 0; q < n; ++q) {
      outputs[q].copy_(packed_out.narrow(0, off, recv[q]).view(outputs[q].sizes()));
      off += recv[q];
    }
    return enqueued_work(outputs);
  });
}

// A barrier names no tensor: it runs on the CPU engine, as gloo's does, unless
// the call names CUDA devices (NCCL's device_ids).
Work Backend::barrier(const c10d::BarrierOptions& opts) {
  Call c = Call::rooted(0, opts.timeout);
  if (!opts.device_ids.empty() && cuda_) {
    c.device = int(opts.device_ids[0]);
    return record("barrier", at::Tensor(), [&] { return cuda_->barrier(c); });
  }
  return record("barrier", at::Tensor(), [&] { return cpu_engine().barrier(c); });
}

void Backend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  // Several hosts: gloo's own over every rank (gloo's point to point takes no
  // tag outside a user's, which the one below is).
  if (cpu_hier_) return cpu_hier_->world()->monitoredBarrier(opts, wait_all_ranks);
  Engine& e = cpu_engine();
  // One byte each way over point to point, on a tag no user send can have.
  constexpr int kTag = INT32_MIN + 7;
  const std::chrono::milliseconds timeout = opts.timeout;  // torch always passes one; 0 times out at once, as gloo
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      deadline - std::chrono::steady_clock::now()));
  };
  at::Tensor token = at::zeros({1}, at::kByte);
  if (getRank() != 0) {
    e.send(token, 0, kTag)->wait(left());
    Work release = e.recv(token, 0, kTag);
    try {
      release->wait(left());
    } catch (const std::exception& ex) {
      late_tokens_.push_back(release);  // still posted: keep its buffer alive
      C10_THROW_ERROR(DistBackendError, "Rank " + std::to_string(getRank()) +
                                            " successfully reached monitoredBarrier, but received errors while "
                                            "waiting for send/recv from rank 0. Please check rank 0 logs for "
                                            "faulty rank (" + ex.what() + ")");
    }
    return;
  }
  TORCH_CHECK_WITH(DistBackendError, timeout.count() > 0, "Rank 0 timed out in monitoredBarrier after ",
                   timeout.count(), " ms");
  std::vector<int> missing;
  for (int r = 1; r < getSize(); ++r) {
    at::Tensor got = at::zeros({1}, at::kByte);
    Work work = e.recv(got, r, kTag);
    try {
      work->wait(left());
    } catch (const std::exception&) {
      // The receive stays posted (a late rank's token lands there): its
      // Work keeps the buffer alive.
      late_tokens_.push_back(work);
      missing.push_back(r);
      if (!wait_all_ranks) break;
    }
  }
  if (!missing.empty()) {
    std::string ranks;
    for (int r : missing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    C10_THROW_ERROR(DistBackendError, "[Rank 0]: Rank" + std::string(missing.size() > 1 ? "s " : " ") + ranks +
                                          " failed to pass monitoredBarrier in " + std::to_string(timeout.count()) +
                                          " ms");
  }
  for (int r = 1; r < getSize(); ++r) e.send(token, r, kTag)->wait(left());
}

Work Backend::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  checks::one("send", "tensors", tensors.size());
  checks::tensor("send", "tensors[0]", tensors[0]);
  checks::contiguous("send", "tensors[0]", tensors[0]);
  checks::peer("send", "dst", dst_rank, getRank(), getSize());
  return record("send", tensors[0],
                [&] { return engine_for("send", "tensors[0]", tensors[0]).send(tensors[0], dst_rank, tag); });
}

Work Backend::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  checks::one("recv", "tensors", tensors.size());
  checks::tensor("recv", "tensors[0]", tensors[0]);
  checks::contiguous("recv", "tensors[0]", tensors[0]);
  checks::peer("recv", "src", src_rank, getRank(), getSize());
  return record("recv", tensors[0],
                [&] { return engine_for("recv", "tensors[0]", tensors[0]).recv(tensors[0], src_rank, tag); });
}

Work Backend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  checks::one("recv", "tensors", tensors.size());
  checks::tensor("recv", "tensors[0]", tensors[0]);
  checks::contiguous("recv", "tensors[0]", tensors[0]);
  return record("recv", tensors[0],
                [&] { return engine_for("recv", "tensors[0]", tensors[0]).recv(tensors[0], -1, tag); });
}

// ---------------------------------------------------------------- fastpar's own calls

void Backend::direct_all_reduce(const at::Tensor& t, int64_t op) {
  TORCH_CHECK_VALUE(op >= 0 && op <= int64_t(ReduceOp::BXOR), "fastpar.all_reduce: op has value ", op,
                    ", which is not one of SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR (0..7)");
  if (t.is_sparse() || !t.is_contiguous()) {  // the sparse form, or staged: allreduce() and its Work
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp(static_cast<c10d::ReduceOp::RedOpType>(op));
    std::vector<at::Tensor> ts{t};
    allreduce(ts, opts)->wait();
    return;
  }
  // allreduce() without its Work and tensor list.
  checks::tensor("all_reduce", "tensors[0]", t);
  const c10d::ReduceOp torch_op(static_cast<c10d::ReduceOp::RedOpType>(op));
  checks::reducible("all_reduce", torch_op, "tensors[0]", t);
  ++calls_;
  at::Tensor in_place = t;
  CallRange range("all_reduce", t);
  engine_for("all_reduce", "tensors[0]", t).all_reduce_now(in_place, reducing_call(torch_op, std::chrono::milliseconds(0)));
}

void Backend::direct_broadcast(const at::Tensor& t, int64_t root) {
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  std::vector<at::Tensor> ts{t};
  broadcast(ts, opts)->wait();
}

void Backend::direct_all_gather_into_tensor(const at::Tensor& output, const at::Tensor& input) {
  at::Tensor out = output, in = input;
  _allgather_base(out, in, c10d::AllgatherOptions())->wait();
}

at::Tensor Backend::registered_empty(const std::vector<int64_t>& sizes, at::ScalarType dtype,
                                     const at::Device& device) {
  to_dtype("registered_empty", "dtype", dtype);
  for (size_t i = 0; i < sizes.size(); ++i)
    TORCH_CHECK_VALUE(sizes[i] >= 0, "fastpar.registered_empty: shape[", i, "] is ", sizes[i],
                      " but sizes must be >= 0");
  TORCH_CHECK_VALUE(device.is_cpu() || device.is_cuda(), "fastpar.registered_empty: device is '", device.str(),
                    "' but registered tensors are CPU or CUDA tensors");
  // CPU: this host's segment, also when the group spans hosts.
  if (device.is_cpu()) return shm_->registered_empty(sizes, dtype, -1);
  TORCH_CHECK_VALUE(cuda_, "fastpar.registered_empty: device is '", device.str(),
                    "' but this group has no fastpar CUDA backend (see fastpar.distributed.cuda_supported())");
  return cuda_->registered_empty(sizes, dtype, device.index());
}

bool Backend::is_registered(const at::Tensor& t) const {
  if (!t.defined()) return false;
  if (t.is_cpu()) return shm_->is_registered(t);
  return cuda_ && t.is_cuda() && cuda_->is_registered(t);
}

int64_t Backend::hierarchical_calls() const {
  return cpu_hier_ ? cpu_hier_->hierarchical_calls() : 0;
}

std::string Backend::hosts_allreduce() const {
  return cpu_hier_ ? cpu_hier_->hosts_allreduce() : "";
}

void Backend::set_allreduce_tuning(int64_t one_shot_max_bytes, int algo) {
  TORCH_CHECK_VALUE(one_shot_max_bytes >= -1, "fastpar: one_shot_max_bytes is ", one_shot_max_bytes,
                    " but must be >= 0, or -1 for the default");
  TORCH_CHECK_VALUE(algo >= 0 && algo <= 2, "fastpar: algo is ", algo,
                    " but must be 0 (auto), 1 (one_shot) or 2 (two_shot)");
  shm_->set_allreduce_tuning(one_shot_max_bytes, algo);
}

void register_distributed(pybind11::module& m) {
  namespace py = pybind11;
  py::module::import("torch._C._distributed_c10d");  // registers c10d::Backend with pybind first
  register_engine(m);
  py::class_<Backend, c10d::Backend, c10::intrusive_ptr<Backend>>(m, "Backend", R"(
fastpar's torch.distributed backend: checks every call and hands it to the
engine for its tensors' device (`shm`, or `hierarchical` over it on several
hosts, for CPU tensors; `cuda` for CUDA tensors). fastpar.distributed builds it
and its engines for each group.)")
      .def(py::init([](int rank, int size, int64_t timeout_ms, const c10::intrusive_ptr<ShmEngine>& shm,
                       std::optional<c10::intrusive_ptr<HierarchicalEngine>> hierarchical,
                       std::optional<c10::intrusive_ptr<Engine>> cuda) {
             return c10::make_intrusive<Backend>(rank, size, std::chrono::milliseconds(timeout_ms), shm,
                                                 hierarchical.value_or(nullptr), cuda.value_or(nullptr));
           }),
           py::arg("rank"), py::arg("size"), py::arg("timeout_ms"), py::arg("shm"),
           py::arg("hierarchical") = py::none(), py::arg("cuda") = py::none())
      .def("registered_empty", &Backend::registered_empty, py::arg("sizes"), py::arg("dtype"), py::arg("device"),
           py::call_guard<py::gil_scoped_release>())
      .def("is_registered", &Backend::is_registered, py::arg("tensor"))
      .def("_direct_all_reduce", &Backend::direct_all_reduce, py::arg("tensor"), py::arg("op"),
           py::call_guard<py::gil_scoped_release>())
      .def("_direct_broadcast", &Backend::direct_broadcast, py::arg("tensor"), py::arg("root"),
           py::call_guard<py::gil_scoped_release>())
      .def("_direct_all_gather_into_tensor", &Backend::direct_all_gather_into_tensor, py::arg("output"),
           py::arg("input"), py::call_guard<py::gil_scoped_release>())
      .def("_shm_placement",
           [](Backend& b) {
             const cpu_shm::PlacementReport r = b.shm().placement();
             py::dict d;
             d["mode"] = cpu_shm::placement_mode_name(r.mode);
             d["schedule"] = r.far ? "far" : "near";
             py::list classes;
             for (const cpu_shm::PlacementClass& k : r.classes) {
               py::dict e;
               e["min_bytes"] = k.min_bytes;
               e["registered"] = k.registered;
               e["one_shot"] = k.one_shot;
               e["schedule"] = !k.decided ? "measuring" : k.far ? "far" : "near";
               e["settled"] = k.settled;
               e["pairs"] = k.pairs;
               e["calls"] = k.calls;
               e["near_us"] = k.near_us;
               e["far_us"] = k.far_us;
               e["far_over_near"] = k.ratio;
               classes.append(e);
             }
             d["classes"] = classes;
             d["decisions"] = r.decisions;
             d["revisits"] = r.revisits;
             d["rechecks"] = r.rechecks;
             d["checks"] = r.checks;
             d["calls"] = r.calls;
             d["cpus"] = b.shm().cpus();
             d["waits"] = b.shm().crowded() ? "yield" : "spin";
             return d;
           })
      .def_property_readonly("hierarchical", &Backend::hierarchical)
      .def_property_readonly("local_size", &Backend::local_size)
      .def_property_readonly("hierarchical_calls", &Backend::hierarchical_calls)
      .def_property_readonly("hosts_allreduce", &Backend::hosts_allreduce)
      .def_property_readonly("shm_engine", &Backend::shm_engine)
      .def_property_readonly("cuda_engine", [](const Backend& b) -> py::object {
        // The CudaEngine or HierarchicalEngine (their own Python types), or None.
        if (!b.cuda_engine()) return py::none();
        return py::cast(b.cuda_engine());
      });
  // Test hooks (fastpar._C._testing): the CPU schedules a group runs, set
  // on every rank between the same calls.
  py::module_ testing = m.attr("_testing");
  testing.def("set_shm_allreduce", &Backend::set_allreduce_tuning, py::arg("backend"), py::arg("one_shot_max_bytes"),
              py::arg("algo"), "FASTPAR_SHM_ONESHOT_MAX_BYTES (-1: the default) and FASTPAR_SHM_ALLREDUCE (0 auto, "
              "1 one_shot, 2 two_shot) of a group, from its next call.");
  testing.def(
      "set_shm_placement",
      [](Backend& b, const std::string& mode) {
        try {
          b.shm().set_placement(cpu_shm::parse_placement_mode(mode, "mode"));
        } catch (const std::invalid_argument& e) {
          TORCH_CHECK_VALUE(false, e.what());
        }
      },
      py::arg("backend"), py::arg("mode"), "FASTPAR_SHM_PLACEMENT of a group, from its next call.");
  testing.def("mark_shm_placement_drifted", [](Backend& b) { b.shm().mark_placement_drifted(); }, py::arg("backend"),
              "This rank reports drift at the group's next check.");
  testing.def(
      "set_shm_placement_delays",
      [](Backend& b, double near_us, double far_us, double noise_us, int64_t revisit_calls, int64_t recheck_calls) {
        b.shm().set_placement_test_hooks(near_us, far_us, noise_us, revisit_calls, recheck_calls);
      },
      py::arg("backend"), py::arg("near_us"), py::arg("far_us"), py::arg("noise_us") = 0.0,
      py::arg("revisit_calls") = 0, py::arg("recheck_calls") = 0,
      "Slows a placement form, or adds noise, in the group's trials.");
  register_shm_engine(m);
  register_hierarchical_engine(m);
  m.attr("SHM_SEGMENT_PREFIX") = cpu_shm::kSegmentPrefix;
}

}  // namespace distributed
}  // namespace fastpar
