#include "shm_backend.h"

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/utils/pybind.h>

#include <numeric>

#include "call_timeout.h"
#include "../ops/checks.h"
#include "../ops/transport_errors.h"

namespace fastpar {
namespace distributed {

using namespace ::fastpar::ops;  // the argument checks and run_transport (csrc/torch/ops)

namespace {

// A collective that already ran: wait() returns at once and get_future() is
// completed with the output tensors, as torch's works are once finished. The
// future is built on first request: DDP asks for it, dist.all_reduce does not,
// and building it costs about a microsecond per call.
class DoneWork : public c10d::Work {
 public:
  DoneWork(c10d::OpType type, std::vector<at::Tensor> outputs) : Work(-1, type), outputs_(std::move(outputs)) {
    completed_ = true;
  }
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::lock_guard<std::mutex> g(future_mu_);
    if (!future_) {
      future_ = c10::make_intrusive<c10::ivalue::Future>(list_type());
      future_->markCompleted(c10::IValue(outputs_));
    }
    return future_;
  }

 private:
  static const c10::TypePtr& list_type() {
    static const c10::TypePtr t = c10::ListType::create(c10::TensorType::get());
    return t;
  }
  std::vector<at::Tensor> outputs_;
  std::mutex future_mu_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

std::string dev(const at::Tensor& t) { return "'" + t.device().str() + "'"; }

// One tensor a collective reads or writes: defined, CPU, contiguous, a dtype
// fastpar handles.
DType check_tensor(const char* op, const std::string& name, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.defined(), "fastpar.", op, ": ", name, " is an undefined tensor");
  TORCH_CHECK_VALUE(t.device().is_cpu(), "fastpar.", op, ": ", name, " is on device ", dev(t),
                    t.is_cuda() ? " but this group has no fastpar CUDA backend (fastpar built without CUDA, or no "
                                  "GPU when the group was created; use \"cpu:fastpar,cuda:nccl\")"
                                : " but the fastpar backend handles CPU and CUDA tensors only");
  TORCH_CHECK_VALUE(t.is_contiguous(), "fastpar.", op, ": ", name, " must be contiguous, but it has sizes ",
                    t.sizes(), " and strides ", t.strides(), " (call .contiguous() first)");
  return to_dtype(op, name, t.scalar_type());
}

// Torch's API passes lists; fastpar runs one tensor per process, as NCCL does.
void check_single(const char* op, const char* arg, size_t got) {
  TORCH_CHECK_VALUE(got == 1, "fastpar.", op, ": expected exactly one tensor in ", arg,
                    " (one per process), got ", got);
}

// `list[q]` like `ref` (same dtype, CPU, contiguous) with `numel` elements.
void check_list(const char* op, const char* arg, const std::vector<at::Tensor>& list, size_t expected_len,
                const std::string& ref_name, const at::Tensor& ref, int64_t numel) {
  TORCH_CHECK_VALUE(list.size() == expected_len, "fastpar.", op, ": ", arg, " has ", list.size(),
                    " tensors but the group has ", expected_len, " ranks");
  for (size_t q = 0; q < list.size(); ++q) {
    const std::string name = indexed(arg, q);
    check_tensor(op, name, list[q]);
    check_like(op, name, list[q], ref_name, ref);
    check_numel(op, name, list[q], numel, "the same number of elements as " + ref_name);
  }
}

// gather's output lists / scatter's input lists (`arg`, `what` in words): on
// the root exactly one list of a tensor per rank, each like `ref`; elsewhere none.
void check_root_lists(const char* op, const char* arg, const char* what,
                      const std::vector<std::vector<at::Tensor>>& lists, int rank, int root, int size,
                      const std::string& ref_name, const at::Tensor& ref) {
  if (rank == root) {
    check_single(op, arg, lists.size());
    check_list(op, (std::string(arg) + "[0]").c_str(), lists[0], size_t(size), ref_name, ref, ref.numel());
  } else {
    TORCH_CHECK_VALUE(lists.empty() || (lists.size() == 1 && lists[0].empty()), "fastpar.", op, ": rank ", rank,
                      " is not the root (", root, ") and must pass no ", what, ", got ", lists.size(), " lists");
  }
}

ReduceOp reduce_op(const char* op, const c10d::ReduceOp& r, const std::string& name, const at::Tensor& t) {
  const int v = int(r.op_);
  TORCH_CHECK_VALUE(v >= 0 && v <= 4, "fastpar.", op, ": op ReduceOp value ", v,
                    " is not supported (supported: SUM, AVG, PRODUCT, MIN, MAX)");
  const ReduceOp rop = ReduceOp(v);
  check_op_dtype(op, rop, name, t);
  return rop;
}


// Elements in `rows` rows of a tensor whose first dimension is dim0.
int64_t row_elems(const at::Tensor& t) { return t.dim() == 0 || t.size(0) == 0 ? 0 : t.numel() / t.size(0); }

}  // namespace

ShmBackend::ShmBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, std::vector<int> local_ranks,
                       std::vector<int> global_ranks, c10::intrusive_ptr<c10d::Backend> leaders,
                       c10::intrusive_ptr<c10d::Backend> world, std::vector<int> hosts,
                       c10::intrusive_ptr<c10d::Backend> cuda)
    : Backend(rank, size),
      tuning_(cpu_shm::default_shm_tuning()),
      timeout_(timeout),
      local_ranks_(std::move(local_ranks)),
      leaders_(std::move(leaders)),
      world_(std::move(world)),
      cuda_(std::move(cuda)) {
  const auto it = std::find(local_ranks_.begin(), local_ranks_.end(), rank);
  TORCH_CHECK_VALUE(it != local_ranks_.end(), "fastpar: rank ", rank, " is not among its host's ranks ",
                    local_ranks_);
  TORCH_CHECK_VALUE(global_ranks.size() == size_t(size), "fastpar: global_ranks has ", global_ranks.size(),
                    " entries but the group has ", size, " ranks");
  std::vector<int> local_global;
  for (int r : local_ranks_) local_global.push_back(global_ranks[r]);
  cpu_shm::Rendezvous rv;
  rv.set = [store](const std::string& k, const std::string& v) {
    store->set(k, std::vector<uint8_t>(v.begin(), v.end()));
  };
  rv.get = [store](const std::string& k) {
    const auto v = store->get(k);
    return std::string(v.begin(), v.end());
  };
  rv.wait = [store](const std::string& k, std::chrono::milliseconds t) { store->wait({k}, t); };
  try {
    comm_ = std::make_shared<cpu_shm::ShmComm>(int(it - local_ranks_.begin()), int(local_ranks_.size()),
                                               local_global, rv, cpu_shm::default_shm_options(timeout));
  } catch (const std::exception& e) {
    C10_THROW_ERROR(DistBackendError, e.what());
  }
  if (world_) init_hosts(std::move(hosts));
  p2p_ = std::make_shared<cpu_shm::ShmP2P>(comm_);
}

c10::intrusive_ptr<c10d::Backend::Options> ShmBackend::getBackendOptions() {
  return c10::make_intrusive<Options>("fastpar", timeout_);
}

std::unique_lock<std::mutex> ShmBackend::start(std::chrono::milliseconds t) {
  std::unique_lock<std::mutex> g(mu_);
  comm_->set_timeout(call_timeout(t, timeout_));
  ++calls_;
  return g;
}

c10::intrusive_ptr<c10d::Work> ShmBackend::done(c10d::OpType type, std::vector<at::Tensor> outputs) {
  return c10::make_intrusive<DoneWork>(type, std::move(outputs));
}

int ShmBackend::local_root(const char* op, int64_t root) const {
  TORCH_CHECK_VALUE(root >= 0 && root < getSize(), "fastpar.", op, ": root rank is ", root, " but the group has ",
                    getSize(), " ranks");
  return int(root);
}

// Runs one transport call, translating its errors (transport_errors.h).
#define FASTPAR_RUN(...) run_transport([&] { __VA_ARGS__; })

c10::intrusive_ptr<c10d::Work> ShmBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceOptions& opts) {
  if (for_cuda(tensors)) return cuda_->allreduce(tensors, opts);
  check_single("all_reduce", "tensors", tensors.size());
  at::Tensor& t = tensors[0];
  const DType dt = check_tensor("all_reduce", "tensors[0]", t);
  const ReduceOp op = reduce_op("all_reduce", opts.reduceOp, "tensors[0]", t);
  auto g = start(opts.timeout);
  if (hier_) return hier_->allreduce(tensors, opts);
  FASTPAR_RUN(cpu_shm::allreduce(*comm_, tuning_, t.data_ptr(), t.data_ptr(), t.numel(), dt, op));
  return done(c10d::OpType::ALLREDUCE, tensors);
}

c10::intrusive_ptr<c10d::Work> ShmBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                               const c10d::AllreduceCoalescedOptions& opts) {
  if (for_cuda(tensors)) return cuda_->allreduce_coalesced(tensors, opts);
  for (auto& t : tensors) {
    std::vector<at::Tensor> one{t};
    allreduce(one, opts);
  }
  return done(c10d::OpType::ALLREDUCE_COALESCED, tensors);
}

c10::intrusive_ptr<c10d::Work> ShmBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                     const c10d::BroadcastOptions& opts) {
  if (for_cuda(tensors)) return cuda_->broadcast(tensors, opts);
  check_single("broadcast", "tensors", tensors.size());
  const DType dt = check_tensor("broadcast", "tensors[0]", tensors[0]);
  const int root = local_root("broadcast", opts.rootRank);
  auto g = start(opts.timeout);
  if (hier_) return hier_->broadcast(tensors, opts);
  FASTPAR_RUN(cpu_shm::broadcast(*comm_, tensors[0].data_ptr(), tensors[0].numel(), dt, root));
  return done(c10d::OpType::BROADCAST, tensors);
}

c10::intrusive_ptr<c10d::Work> ShmBackend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  if (for_cuda(tensors)) return cuda_->reduce(tensors, opts);
  check_single("reduce", "tensors", tensors.size());
  at::Tensor& t = tensors[0];
  const DType dt = check_tensor("reduce", "tensors[0]", t);
  const ReduceOp op = reduce_op("reduce", opts.reduceOp, "tensors[0]", t);
  const int root = local_root("reduce", opts.rootRank);
  auto g = start(opts.timeout);
  if (hier_) return hier_->reduce(tensors, opts);
  FASTPAR_RUN(cpu_shm::reduce(*comm_, t.data_ptr(), t.data_ptr(), t.numel(), dt, op, root));
  return done(c10d::OpType::REDUCE, tensors);
}

c10::intrusive_ptr<c10d::Work> ShmBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) {
  if (for_cuda(inputs)) return cuda_->allgather(outputs, inputs, opts);
  check_single("all_gather", "input_tensors", inputs.size());
  check_single("all_gather", "output_tensors", outputs.size());
  const DType dt = check_tensor("all_gather", "input_tensors[0]", inputs[0]);
  check_list("all_gather", "output_tensors[0]", outputs[0], size_t(getSize()), "input_tensors[0]", inputs[0],
             inputs[0].numel());
  auto g = start(opts.timeout);
  if (hier_) return hier_->allgather(outputs, inputs, opts);
  std::vector<void*> outs;
  for (auto& o : outputs[0]) outs.push_back(o.data_ptr());
  FASTPAR_RUN(cpu_shm::gather(*comm_, inputs[0].data_ptr(), outs.data(), inputs[0].numel(), dt, -1));
  return done(c10d::OpType::ALLGATHER, outputs[0]);
}

c10::intrusive_ptr<c10d::Work> ShmBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                           const c10d::AllgatherOptions& opts) {
  if (for_cuda(input)) return cuda_->_allgather_base(output, input, opts);
  const DType dt = check_tensor("all_gather_into_tensor", "input_tensor", input);
  check_tensor("all_gather_into_tensor", "output_tensor", output);
  check_like("all_gather_into_tensor", "output_tensor", output, "input_tensor", input);
  check_numel("all_gather_into_tensor", "output_tensor", output, input.numel() * getSize(),
              "world size x input_tensor's elements");
  auto g = start(opts.timeout);
  if (hier_) return hier_->_allgather_base(output, input, opts);
  const int64_t bytes = input.numel() * input.element_size();
  std::vector<void*> outs;
  for (int q = 0; q < getSize(); ++q) outs.push_back(static_cast<char*>(output.data_ptr()) + q * bytes);
  FASTPAR_RUN(cpu_shm::gather(*comm_, input.data_ptr(), outs.data(), input.numel(), dt, -1));
  return done(c10d::OpType::_ALLGATHER_BASE, {output});
}

c10::intrusive_ptr<c10d::Work> ShmBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                  std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  if (for_cuda(inputs)) return cuda_->gather(outputs, inputs, opts);
  check_single("gather", "input_tensors", inputs.size());
  const DType dt = check_tensor("gather", "input_tensors[0]", inputs[0]);
  const int root = local_root("gather", opts.rootRank);
  check_root_lists("gather", "output_tensors", "output tensors", outputs, getRank(), root, getSize(),
                   "input_tensors[0]", inputs[0]);
  if (world_) return world_->gather(outputs, inputs, opts);
  auto g = start(opts.timeout);
  std::vector<void*> outs;
  if (getRank() == root)
    for (auto& o : outputs[0]) outs.push_back(o.data_ptr());
  FASTPAR_RUN(cpu_shm::gather(*comm_, inputs[0].data_ptr(), outs.empty() ? nullptr : outs.data(), inputs[0].numel(),
                              dt, root));
  return done(c10d::OpType::GATHER, outputs.empty() ? std::vector<at::Tensor>{} : outputs[0]);
}

c10::intrusive_ptr<c10d::Work> ShmBackend::scatter(std::vector<at::Tensor>& outputs,
                                                   std::vector<std::vector<at::Tensor>>& inputs,
                                                   const c10d::ScatterOptions& opts) {
  if (for_cuda(outputs)) return cuda_->scatter(outputs, inputs, opts);
  check_single("scatter", "output_tensors", outputs.size());
  const DType dt = check_tensor("scatter", "output_tensors[0]", outputs[0]);
  const int root = local_root("scatter", opts.rootRank);
  check_root_lists("scatter", "input_tensors", "input tensors", inputs, getRank(), root, getSize(),
                   "output_tensors[0]", outputs[0]);
  if (world_) return world_->scatter(outputs, inputs, opts);
  auto g = start(opts.timeout);
  std::vector<const void*> ins;
  if (getRank() == root)
    for (auto& i : inputs[0]) ins.push_back(i.data_ptr());
  FASTPAR_RUN(cpu_shm::scatter(*comm_, ins.empty() ? nullptr : ins.data(), outputs[0].data_ptr(), outputs[0].numel(),
                               dt, root));
  return done(c10d::OpType::SCATTER, outputs);
}

c10::intrusive_ptr<c10d::Work> ShmBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                          std::vector<std::vector<at::Tensor>>& inputs,
                                                          const c10d::ReduceScatterOptions& opts) {
  if (for_cuda(outputs)) return cuda_->reduce_scatter(outputs, inputs, opts);
  check_single("reduce_scatter", "output", outputs.size());
  check_single("reduce_scatter", "input_list", inputs.size());
  check_tensor("reduce_scatter", "output", outputs[0]);
  check_list("reduce_scatter", "input_list[0]", inputs[0], size_t(getSize()), "output", outputs[0],
             outputs[0].numel());
  at::Tensor flat = at::cat(inputs[0]);
  _reduce_scatter_base(outputs[0], flat, opts);
  return done(c10d::OpType::REDUCE_SCATTER, outputs);
}

c10::intrusive_ptr<c10d::Work> ShmBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::ReduceScatterOptions& opts) {
  if (for_cuda(output)) return cuda_->_reduce_scatter_base(output, input, opts);
  const DType dt = check_tensor("reduce_scatter_tensor", "output", output);
  check_tensor("reduce_scatter_tensor", "input", input);
  check_like("reduce_scatter_tensor", "input", input, "output", output);
  check_numel("reduce_scatter_tensor", "input", input, output.numel() * getSize(), "world size x output's elements");
  const ReduceOp op = reduce_op("reduce_scatter_tensor", opts.reduceOp, "output", output);
  auto g = start(opts.timeout);
  if (hier_) return hier_->_reduce_scatter_base(output, input, opts);
  FASTPAR_RUN(cpu_shm::reduce_scatter(*comm_, input.data_ptr(), output.data_ptr(), output.numel(), dt, op));
  return done(c10d::OpType::_REDUCE_SCATTER_BASE, {output});
}

c10::intrusive_ptr<c10d::Work> ShmBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                         std::vector<int64_t>& output_split_sizes,
                                                         std::vector<int64_t>& input_split_sizes,
                                                         const c10d::AllToAllOptions& opts) {
  if (for_cuda(input)) return cuda_->alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
  const DType dt = check_tensor("all_to_all_single", "input", input);
  check_tensor("all_to_all_single", "output", output);
  check_like("all_to_all_single", "output", output, "input", input);
  const int n = getSize();
  auto splits = [&](const char* arg, const at::Tensor& t, const std::vector<int64_t>& s) {
    return all_to_all_split(arg, s, t.dim() == 0 ? 1 : t.size(0), row_elems(t), n);
  };
  TORCH_CHECK_VALUE(row_elems(input) == row_elems(output) || input.numel() == 0 || output.numel() == 0,
                    "fastpar.all_to_all_single: input rows have ", row_elems(input), " elements but output rows have ",
                    row_elems(output));
  std::vector<int64_t> ic = splits("input", input, input_split_sizes);
  std::vector<int64_t> oc = splits("output", output, output_split_sizes);
  if (world_) return world_->alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
  std::vector<int64_t> io(n, 0), oo(n, 0);
  for (int q = 1; q < n; ++q) {
    io[q] = io[q - 1] + ic[q - 1];
    oo[q] = oo[q - 1] + oc[q - 1];
  }
  auto g = start(opts.timeout);
  FASTPAR_RUN(cpu_shm::alltoall(*comm_, input.data_ptr(), io.data(), ic.data(), output.data_ptr(), oo.data(),
                                oc.data(), dt));
  return done(c10d::OpType::ALLTOALL_BASE, {output});
}

c10::intrusive_ptr<c10d::Work> ShmBackend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                    const c10d::AllToAllOptions& opts) {
  if (for_cuda(inputs)) return cuda_->alltoall(outputs, inputs, opts);
  const int n = getSize();
  TORCH_CHECK_VALUE(int(inputs.size()) == n, "fastpar.all_to_all: input_tensor_list has ", inputs.size(),
                    " tensors but the group has ", n, " ranks");
  TORCH_CHECK_VALUE(int(outputs.size()) == n, "fastpar.all_to_all: output_tensor_list has ", outputs.size(),
                    " tensors but the group has ", n, " ranks");
  for (int q = 0; q < n; ++q) {
    check_tensor("all_to_all", indexed("input_tensor_list", q), inputs[q]);
    check_tensor("all_to_all", indexed("output_tensor_list", q), outputs[q]);
    check_like("all_to_all", indexed("input_tensor_list", q), inputs[q], "input_tensor_list[0]", inputs[0]);
    check_like("all_to_all", indexed("output_tensor_list", q), outputs[q], "input_tensor_list[0]", inputs[0]);
  }
  if (hier_) return hier_->alltoall(outputs, inputs, opts);  // several hosts: world's alltoall_base, packed
  std::vector<at::Tensor> flat_in, flat_out;
  for (int q = 0; q < n; ++q) {
    flat_in.push_back(inputs[q].reshape({-1}));
    flat_out.push_back(outputs[q].reshape({-1}));
  }
  at::Tensor in = at::cat(flat_in), out = at::empty({int64_t(0)}, inputs[0].options());
  int64_t total = 0;
  std::vector<int64_t> ic(n), oc(n);
  for (int q = 0; q < n; ++q) {
    ic[q] = inputs[q].numel();
    oc[q] = outputs[q].numel();
    total += oc[q];
  }
  out = at::empty({total}, inputs[0].options());
  std::vector<int64_t> io(n, 0), oo(n, 0);
  for (int q = 1; q < n; ++q) {
    io[q] = io[q - 1] + ic[q - 1];
    oo[q] = oo[q - 1] + oc[q - 1];
  }
  {
    auto g = start(opts.timeout);
    const DType dt = to_dtype("all_to_all", "input_tensor_list[0]", inputs[0].scalar_type());
    FASTPAR_RUN(cpu_shm::alltoall(*comm_, in.data_ptr(), io.data(), ic.data(), out.data_ptr(), oo.data(),
                                  oc.data(), dt));
  }
  for (int q = 0; q < n; ++q) flat_out[q].copy_(out.narrow(0, oo[q], oc[q]));
  return done(c10d::OpType::ALLTOALL, outputs);
}

c10::intrusive_ptr<c10d::Work> ShmBackend::barrier(const c10d::BarrierOptions& opts) {
  auto g = start(opts.timeout);
  FASTPAR_RUN(cpu_shm::barrier(*comm_));
  if (world_) {
    if (leaders_) {
      c10d::BarrierOptions o;
      o.timeout = call_timeout(opts.timeout, timeout_);
      leaders_->barrier(o)->wait();
    }
    FASTPAR_RUN(cpu_shm::barrier(*comm_));
  }
  return done(c10d::OpType::BARRIER, {});
}

c10::intrusive_ptr<c10d::Work> ShmBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                               std::vector<at::Tensor>& inputs,
                                                               const c10d::AllgatherOptions& opts) {
  if (for_cuda(inputs)) return cuda_->allgather_coalesced(outputs, inputs, opts);
  return Backend::allgather_coalesced(outputs, inputs, opts);  // not supported: the base class says so
}

c10::intrusive_ptr<c10d::Work> ShmBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                           std::vector<at::Tensor>& inputs,
                                                                           const c10d::AllgatherOptions& opts) {
  if (for_cuda(inputs)) return cuda_->allgather_into_tensor_coalesced(outputs, inputs, opts);
  return Backend::allgather_into_tensor_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ShmBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                           std::vector<at::Tensor>& inputs,
                                                                           const c10d::ReduceScatterOptions& opts) {
  if (for_cuda(inputs)) return cuda_->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
  return Backend::reduce_scatter_tensor_coalesced(outputs, inputs, opts);
}

at::Tensor ShmBackend::registered_empty(const std::vector<int64_t>& sizes, at::ScalarType dtype) {
  const DType dt = to_dtype("registered_empty", "dtype", dtype);
  int64_t numel = 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    TORCH_CHECK_VALUE(sizes[i] >= 0, "fastpar.registered_empty: shape[", i, "] is ", sizes[i],
                      " but sizes must be >= 0");
    numel *= sizes[i];
  }
  int64_t off = -1;
  {
    auto g = start(std::chrono::milliseconds(0));
    FASTPAR_RUN(off = cpu_shm::register_alloc(*comm_, numel * dtype_size(dt)));
  }
  std::shared_ptr<cpu_shm::ShmComm> comm = comm_;  // the tensor keeps the mapping alive
  return at::from_blob(
      comm_->arena(comm_->rank()) + off, sizes, [comm, off](void*) { comm->arena_free(off); },
      at::TensorOptions().dtype(dtype).device(at::kCPU));
}

void ShmBackend::direct_all_reduce(const at::Tensor& t, int64_t op) {
  TORCH_CHECK_VALUE(op >= 0 && op <= 4, "fastpar.all_reduce: op ReduceOp value ", op,
                    " is not supported (supported: SUM, AVG, PRODUCT, MIN, MAX)");
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp(static_cast<c10d::ReduceOp::RedOpType>(op));
  if (for_cuda(t) || world_) {  // CUDA: wait() orders the current stream after it
    std::vector<at::Tensor> ts{t};
    allreduce(ts, opts)->wait();
    return;
  }
  // The CPU path of allreduce() without its Work and tensor list: the same
  // checks, words and schedule.
  const DType dt = check_tensor("all_reduce", "tensors[0]", t);
  const ReduceOp rop = reduce_op("all_reduce", opts.reduceOp, "tensors[0]", t);
  auto g = start(std::chrono::milliseconds(0));
  FASTPAR_RUN(cpu_shm::allreduce(*comm_, tuning_, t.data_ptr(), t.data_ptr(), t.numel(), dt, rop));
}

void ShmBackend::direct_broadcast(const at::Tensor& t, int64_t root) {
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  std::vector<at::Tensor> ts{t};
  broadcast(ts, opts)->wait();
}

void ShmBackend::direct_all_gather_into_tensor(const at::Tensor& output, const at::Tensor& input) {
  at::Tensor out = output, in = input;
  _allgather_base(out, in, c10d::AllgatherOptions())->wait();
}

void ShmBackend::set_allreduce_tuning(int64_t one_shot_max_bytes, int algo) {
  TORCH_CHECK_VALUE(one_shot_max_bytes >= -1, "fastpar: one_shot_max_bytes is ", one_shot_max_bytes,
                    " but must be >= 0, or -1 for the default");
  TORCH_CHECK_VALUE(algo >= 0 && algo <= 2, "fastpar: algo is ", algo, " but must be 0 (auto), 1 (one_shot) or 2 (two_shot)");
  std::lock_guard<std::mutex> g(mu_);
  tuning_.one_shot_max_bytes = one_shot_max_bytes;
  tuning_.algo = cpu_shm::AllreduceAlgo(algo);
}

bool ShmBackend::is_registered(const at::Tensor& t) const {
  return t.defined() && t.device().is_cpu() &&
         comm_->arena_offset(t.data_ptr(), t.numel() * int64_t(t.element_size())) >= 0;
}

void register_distributed(pybind11::module& m) {
  namespace py = pybind11;
  py::module::import("torch._C._distributed_c10d");  // registers c10d::Backend with pybind first
  py::class_<ShmBackend, c10d::Backend, c10::intrusive_ptr<ShmBackend>>(m, "ShmBackend", R"(
fastpar's torch.distributed backend (created by fastpar.distributed; not meant
to be constructed by hand).)")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, int64_t timeout_ms,
                       std::vector<int> local_ranks, std::vector<int> global_ranks,
                       std::optional<c10::intrusive_ptr<c10d::Backend>> leaders,
                       std::optional<c10::intrusive_ptr<c10d::Backend>> world, std::vector<int> hosts,
                       std::optional<c10::intrusive_ptr<c10d::Backend>> cuda) {
             return c10::make_intrusive<ShmBackend>(store, rank, size, std::chrono::milliseconds(timeout_ms),
                                                    std::move(local_ranks), std::move(global_ranks),
                                                    leaders.value_or(nullptr), world.value_or(nullptr),
                                                    std::move(hosts), cuda.value_or(nullptr));
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_ms"), py::arg("local_ranks"),
           py::arg("global_ranks"), py::arg("leaders") = py::none(), py::arg("world") = py::none(),
           py::arg("hosts") = std::vector<int>{}, py::arg("cuda") = py::none(),
           py::call_guard<py::gil_scoped_release>())
      .def("registered_empty", &ShmBackend::registered_empty, py::arg("sizes"), py::arg("dtype"),
           py::call_guard<py::gil_scoped_release>())
      .def("is_registered", &ShmBackend::is_registered, py::arg("tensor"))
      .def("_direct_all_reduce", &ShmBackend::direct_all_reduce, py::arg("tensor"), py::arg("op"),
           py::call_guard<py::gil_scoped_release>())
      .def("_direct_broadcast", &ShmBackend::direct_broadcast, py::arg("tensor"), py::arg("root"),
           py::call_guard<py::gil_scoped_release>())
      .def("_direct_all_gather_into_tensor", &ShmBackend::direct_all_gather_into_tensor, py::arg("output"),
           py::arg("input"), py::call_guard<py::gil_scoped_release>())
      .def("_set_allreduce_tuning", &ShmBackend::set_allreduce_tuning, py::arg("one_shot_max_bytes"),
           py::arg("algo"))
      .def_property_readonly("hierarchical", &ShmBackend::hierarchical)
      .def_property_readonly("local_size", &ShmBackend::local_size)
      .def_property_readonly("hierarchical_calls", &ShmBackend::hierarchical_calls)
      .def_property_readonly("cuda_backend", [](const ShmBackend& b) -> py::object {
        // The CudaBackend (its own Python type in CUDA builds) or None.
        if (!b.cuda_backend()) return py::none();
        return py::cast(b.cuda_backend());
      });
  m.attr("SHM_SEGMENT_PREFIX") = cpu_shm::kSegmentPrefix;
}

}  // namespace distributed
}  // namespace fastpar
