#include "backend.h"

#include <torch/csrc/utils/pybind.h>

#include "../../core/transport/cpu_shm/shm_segment.h"  // kSegmentPrefix
#include "../dtypes.h"  // to_dtype
#include "checks.h"
#include "engine.h"
#include "staging.h"

namespace fastpar {
namespace distributed {

namespace {

using Work = c10::intrusive_ptr<c10d::Work>;

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
    TORCH_CHECK_VALUE(cpu_hier_->getRank() == rank && cpu_hier_->getSize() == size, "fastpar: hierarchical is rank ",
                      cpu_hier_->getRank(), " of ", cpu_hier_->getSize(), " but the group's rank is ", rank, " of ",
                      size);
  } else {
    TORCH_CHECK_VALUE(shm_->getSize() == size, "fastpar: shm has ", shm_->getSize(), " ranks but the group has ", size,
                      " (a group over several hosts needs hierarchical)");
  }
}

Backend::~Backend() { drop_without_gil(cuda_, cpu_hier_, shm_); }

c10::intrusive_ptr<c10d::Backend::Options> Backend::getBackendOptions() {
  return c10::make_intrusive<Options>("fastpar", timeout_);
}

void Backend::setTimeout(std::chrono::milliseconds timeout) {
  timeout_ = timeout;
  cpu_engine().setTimeout(timeout);
  if (cuda_) cuda_->setTimeout(timeout);
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

template <class Call>
Work Backend::dispatch(const char* op, const std::string& name, const at::Tensor& t, Call&& call) {
  Staging s;
  return record([&] { return s.done(call(engine_for(op, name, t), s)); });
}

// Inside a coalescing block a failure is not raised at the call: torch's
// coalescing manager (batch_isend_irecv, _coalescing_manager) leaves the
// group's op list behind when its block raises, and from then on torch
// issues none of that group's calls (a sync collective returns having done
// nothing, an async one an _IllegalWork). The failed call's Work carries the
// error instead, and the block's Work (endCoalescing) raises it at wait().
// Argument errors are raised at once, as everywhere.
template <class Call>
Work Backend::record(Call&& call) {
  Work work;
  try {
    work = call();
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
    return e.allreduce(s.list(tensors, true), opts);
  });
}

Work Backend::allreduce_sparse(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  const char* op = "all_reduce";
  checks::one(op, "tensors", tensors.size());
  at::Tensor& t = tensors[0];
  TORCH_CHECK_VALUE(t.defined() && t.is_sparse(), "fastpar.", op, ": tensors[0] is not a sparse COO tensor");
  TORCH_CHECK_VALUE(opts.reduceOp == c10d::ReduceOp::SUM, "fastpar.", op, ": sparse tensors reduce with "
                    "ReduceOp.SUM only, got ReduceOp value ", int(opts.reduceOp.op_));
  return record([&] { return engine_for(op, "tensors[0]", t).allreduce_sparse(tensors, opts); });
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
    return e.allreduce_coalesced(s.list(tensors, true), opts);
  });
}

Work Backend::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  checks::one("broadcast", "tensors", tensors.size());
  checks::tensor("broadcast", "tensors[0]", tensors[0]);
  checks::root("broadcast", opts.rootRank, getSize());
  return dispatch("broadcast", "tensors[0]", tensors[0], [&](Engine& e, Staging& s) {
    return e.broadcast(s.list(tensors, true), opts);
  });
}

Work Backend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  checks::one("reduce", "tensors", tensors.size());
  checks::tensor("reduce", "tensors[0]", tensors[0]);
  checks::reducible("reduce", opts.reduceOp, "tensors[0]", tensors[0]);
  checks::root("reduce", opts.rootRank, getSize());
  return dispatch("reduce", "tensors[0]", tensors[0], [&](Engine& e, Staging& s) {
    return e.reduce(s.list(tensors, true), opts);
  });
}

Work Backend::allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                        const c10d::AllgatherOptions& opts) {
  checks::one("all_gather", "input_tensors", inputs.size());
  checks::one("all_gather", "output_tensors", outputs.size());
  const at::Tensor& in = inputs[0];
  checks::tensor("all_gather", "input_tensors[0]", in);
  checks::per_rank("all_gather", "output_tensors[0]", outputs[0], getSize(), "input_tensors[0]", in, in.numel());
  return dispatch("all_gather", "input_tensors[0]", in, [&](Engine& e, Staging& s) {
    return e.allgather(s.lists(outputs, true), s.list(inputs, false), opts);
  });
}

Work Backend::_allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  checks::tensor("all_gather_into_tensor", "input_tensor", input);
  checks::tensor("all_gather_into_tensor", "output_tensor", output);
  checks::like("all_gather_into_tensor", "output_tensor", output, "input_tensor", input, input.numel() * getSize(),
               "world size x input_tensor's elements");
  return dispatch("all_gather_into_tensor", "input_tensor", input, [&](Engine& e, Staging& s) {
    return e._allgather_base(s.one(output, true), s.one(input, false), opts);
  });
}

Work Backend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                  const c10d::AllgatherOptions& opts) {
  // output_tensor_lists[r][i] receives rank r's input_tensor_list[i] (as gloo's).
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
    return e.allgather_coalesced(s.lists(outputs, true), s.list(inputs, false), opts);
  });
}

Work Backend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                              const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather_into_tensor_coalesced";
  checks::coalesced_flat(op, outputs, inputs, /*small_is_output=*/false, getSize(), nullptr);
  return dispatch(op, "inputs[0]", inputs[0], [&](Engine& e, Staging& s) {
    return e.allgather_into_tensor_coalesced(s.list(outputs, true), s.list(inputs, false), opts);
  });
}

Work Backend::gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                     const c10d::GatherOptions& opts) {
  checks::one("gather", "input_tensors", inputs.size());
  checks::tensor("gather", "input_tensors[0]", inputs[0]);
  checks::root_lists("gather", "output_tensors", outputs, getRank(), int(opts.rootRank), getSize(),
                     "input_tensors[0]", inputs[0]);
  return dispatch("gather", "input_tensors[0]", inputs[0], [&](Engine& e, Staging& s) {
    return e.gather(s.lists(outputs, true), s.list(inputs, false), opts);
  });
}

#if FASTPAR_TORCH_AT_LEAST(2, 14)
Work Backend::gather_into_tensor(at::Tensor& output, at::Tensor& input, const c10d::GatherOptions& opts) {
  checks::tensor("gather_into_tensor", "input", input);
  checks::root("gather_into_tensor", opts.rootRank, getSize());
  if (getRank() == opts.rootRank) {
    checks::tensor("gather_into_tensor", "output", output);
    checks::like("gather_into_tensor", "output", output, "input", input, input.numel() * getSize(),
                 "world size x input's elements");
  }
  return dispatch("gather_into_tensor", "input", input, [&](Engine& e, Staging& s) {
    return e.gather_into_tensor(s.one(output, true), s.one(input, false), opts);
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
    return e.scatter(s.list(outputs, true), s.lists(inputs, false), opts);
  });
}

Work Backend::reduce_scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                             const c10d::ReduceScatterOptions& opts) {
  checks::one("reduce_scatter", "output", outputs.size());
  checks::one("reduce_scatter", "input_list", inputs.size());
  checks::tensor("reduce_scatter", "output", outputs[0]);
  checks::reducible("reduce_scatter", opts.reduceOp, "output", outputs[0]);
  checks::per_rank("reduce_scatter", "input_list[0]", inputs[0], getSize(), "output", outputs[0],
                   outputs[0].numel());
  return dispatch("reduce_scatter", "output", outputs[0], [&](Engine& e, Staging& s) {
    return e.reduce_scatter(s.list(outputs, true), s.lists(inputs, false), opts);
  });
}

Work Backend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  checks::tensor("reduce_scatter_tensor", "output", output);
  checks::tensor("reduce_scatter_tensor", "input", input);
  checks::like("reduce_scatter_tensor", "input", input, "output", output, output.numel() * getSize(),
               "world size x output's elements");
  checks::reducible("reduce_scatter_tensor", opts.reduceOp, "output", output);
  return dispatch("reduce_scatter_tensor", "output", output, [&](Engine& e, Staging& s) {
    return e._reduce_scatter_base(s.one(output, true), s.one(input, false), opts);
  });
}

Work Backend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                              const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter_tensor_coalesced";
  checks::coalesced_flat(op, outputs, inputs, /*small_is_output=*/true, getSize(), &opts.reduceOp);
  return dispatch(op, "outputs[0]", outputs[0], [&](Engine& e, Staging& s) {
    return e.reduce_scatter_tensor_coalesced(s.list(outputs, true), s.list(inputs, false), opts);
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
    return e.alltoall_base(s.one(output, true), s.one(input, false), output_split_sizes, input_split_sizes, opts);
  });
}

Work Backend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                       const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all";
  TORCH_CHECK_VALUE(int(inputs.size()) == getSize(), "fastpar.", op, ": input_tensor_list has ", inputs.size(),
                    " tensors but the group has ", getSize(), " ranks");
  TORCH_CHECK_VALUE(int(outputs.size()) == getSize(), "fastpar.", op, ": output_tensor_list has ", outputs.size(),
                    " tensors but the group has ", getSize(), " ranks");
  for (int q = 0; q < getSize(); ++q) {
    const std::string in = indexed("input_tensor_list", q), out = indexed("output_tensor_list", q);
    checks::tensor(op, in, inputs[q]);
    checks::tensor(op, out, outputs[q]);
    checks::like(op, in, inputs[q], "input_tensor_list[0]", inputs[0], inputs[q].numel(), "");
    checks::like(op, out, outputs[q], "input_tensor_list[0]", inputs[0], outputs[q].numel(), "");
  }
  checks::own_block(op, int64_t(inputs[getRank()].nbytes()), int64_t(outputs[getRank()].nbytes()));
  return dispatch(op, "input_tensor_list[0]", inputs[0], [&](Engine& e, Staging& s) {
    return e.alltoall(s.list(outputs, true), s.list(inputs, false), opts);
  });
}

// A barrier names no tensor: it runs on the CPU engine, as gloo's does, unless
// the call names CUDA devices (NCCL's device_ids).
Work Backend::barrier(const c10d::BarrierOptions& opts) {
  if (!opts.device_ids.empty() && cuda_) return record([&] { return cuda_->barrier(opts); });
  return record([&] { return cpu_engine().barrier(opts); });
}

void Backend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  cpu_engine().monitoredBarrier(opts, wait_all_ranks);
}

Work Backend::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  checks::one("send", "tensors", tensors.size());
  checks::tensor("send", "tensors[0]", tensors[0]);
  checks::contiguous("send", "tensors[0]", tensors[0]);
  checks::peer("send", "dst", dst_rank, getRank(), getSize());
  return record([&] { return engine_for("send", "tensors[0]", tensors[0]).send(tensors, dst_rank, tag); });
}

Work Backend::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  checks::one("recv", "tensors", tensors.size());
  checks::tensor("recv", "tensors[0]", tensors[0]);
  checks::contiguous("recv", "tensors[0]", tensors[0]);
  checks::peer("recv", "src", src_rank, getRank(), getSize());
  return record([&] { return engine_for("recv", "tensors[0]", tensors[0]).recv(tensors, src_rank, tag); });
}

Work Backend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  checks::one("recv", "tensors", tensors.size());
  checks::tensor("recv", "tensors[0]", tensors[0]);
  checks::contiguous("recv", "tensors[0]", tensors[0]);
  return record([&] { return engine_for("recv", "tensors[0]", tensors[0]).recvAnysource(tensors, tag); });
}

// ---------------------------------------------------------------- fastpar's own calls

void Backend::direct_all_reduce(const at::Tensor& t, int64_t op) {
  TORCH_CHECK_VALUE(op >= 0 && op <= int64_t(ReduceOp::BXOR), "fastpar.all_reduce: op has value ", op,
                    ", which is not one of SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR (0..7)");
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp(static_cast<c10d::ReduceOp::RedOpType>(op));
  if (t.is_sparse() || !t.is_contiguous()) {  // the sparse form, or staged: allreduce() and its Work
    std::vector<at::Tensor> ts{t};
    allreduce(ts, opts)->wait();
    return;
  }
  // allreduce() without its Work and tensor list.
  checks::tensor("all_reduce", "tensors[0]", t);
  checks::reducible("all_reduce", opts.reduceOp, "tensors[0]", t);
  ++calls_;
  at::Tensor in_place = t;
  engine_for("all_reduce", "tensors[0]", t).allreduce_direct(in_place, opts);
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
  py::class_<Engine, c10d::Backend, c10::intrusive_ptr<Engine>>(m, "Engine", R"(
One of fastpar's engines (the group's fastpar._C.Backend hands them its checked
calls): ShmEngine, CudaEngine, HierarchicalEngine.)");
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
      .def("_set_allreduce_tuning", &Backend::set_allreduce_tuning, py::arg("one_shot_max_bytes"),
           py::arg("algo"))
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
             d["checks"] = r.checks;
             d["large_calls"] = r.large_calls;
             return d;
           })
      .def(
          "_set_shm_placement",
          [](Backend& b, const std::string& mode) {
            try {
              b.shm().set_placement(cpu_shm::parse_placement_mode(mode, "mode"));
            } catch (const std::invalid_argument& e) {
              TORCH_CHECK_VALUE(false, e.what());
            }
          },
          py::arg("mode"))
      .def("_mark_shm_placement_drifted", [](Backend& b) { b.shm().mark_placement_drifted(); })
      .def("_set_shm_placement_test_hooks",
           [](Backend& b, double near_us, double far_us, double noise_us, int64_t revisit_calls) {
             b.shm().set_placement_test_hooks(near_us, far_us, noise_us, revisit_calls);
           },
           py::arg("near_us"), py::arg("far_us"), py::arg("noise_us") = 0.0, py::arg("revisit_calls") = 0)
      .def_property_readonly("hierarchical", &Backend::hierarchical)
      .def_property_readonly("local_size", &Backend::local_size)
      .def_property_readonly("hierarchical_calls", &Backend::hierarchical_calls)
      .def_property_readonly("hosts_allreduce", &Backend::hosts_allreduce)
      .def_property_readonly("cuda_engine", [](const Backend& b) -> py::object {
        // The CudaEngine or HierarchicalEngine (their own Python types), or None.
        if (!b.cuda_engine()) return py::none();
        return py::cast(b.cuda_engine());
      });
  register_shm_engine(m);
  register_hierarchical_engine(m);
  m.attr("SHM_SEGMENT_PREFIX") = cpu_shm::kSegmentPrefix;
}

}  // namespace distributed
}  // namespace fastpar
