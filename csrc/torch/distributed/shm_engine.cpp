#include "shm_engine.h"

#include <ATen/core/ivalue.h>

#include "../dtypes.h"  // maybe_dtype
#include "checks.h"
#include "knobs.h"  // shm_knobs

namespace fastpar {
namespace distributed {

namespace {

// A collective that already ran: wait() returns at once and get_future() is
// completed with the output tensors, as torch's works are once finished. The
// future is built on first request: DDP asks for it, dist.all_reduce does not,
// and building it costs about a microsecond per call. One output (every
// in-place collective) is held without a vector: the list result() returns
// is built when asked for, so the common call allocates only this object.
class DoneWork : public c10d::Work {
 public:
  DoneWork(c10d::OpType type, const std::vector<at::Tensor>& outputs) : Work(-1, type) {
    fill(outputs);
    completed_ = true;
  }
  // Makes this Work that of another call of the same op. Only while nobody
  // else holds it (recycle() checks): no one can see it change.
  void refill(const std::vector<at::Tensor>& outputs) {
    fill(outputs);
    future_.reset();
  }
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
  std::vector<at::Tensor> result() override { return outputs(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::lock_guard<std::mutex> g(future_mu_);
    if (!future_) {
      future_ = c10::make_intrusive<c10::ivalue::Future>(list_type());
      future_->markCompleted(c10::IValue(outputs()));
    }
    return future_;
  }

 private:
  static const c10::TypePtr& list_type() {
    static const c10::TypePtr t = c10::ListType::create(c10::TensorType::get());
    return t;
  }
  void fill(const std::vector<at::Tensor>& outputs) {
    single_ = outputs.size() == 1;
    if (single_) {
      one_ = outputs[0];
      many_.clear();
    } else {
      one_ = at::Tensor();
      many_ = outputs;
    }
  }
  std::vector<at::Tensor> outputs() const { return single_ ? std::vector<at::Tensor>{one_} : many_; }
  bool single_ = false;
  at::Tensor one_;
  std::vector<at::Tensor> many_;
  std::mutex future_mu_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

c10::intrusive_ptr<c10d::Work> done(c10d::OpType type, const std::vector<at::Tensor>& outputs) {
  return c10::make_intrusive<DoneWork>(type, outputs);
}

// `spare` again, refilled with `outputs`, if only `spare` holds it (no
// caller, no weak reference); else a new DoneWork, which becomes the spare.
c10::intrusive_ptr<c10d::Work> recycle(c10::intrusive_ptr<c10d::Work>& spare, c10d::OpType type,
                                       const std::vector<at::Tensor>& outputs) {
  if (spare && spare.use_count() == 1 && spare.weak_use_count() == 1) {
    static_cast<DoneWork*>(spare.get())->refill(outputs);
    return spare;
  }
  spare = done(type, outputs);
  return spare;
}

// How a copy collective describes its elements to the schedules (and to the
// peers' mismatch check): as fastpar's dtype where it has one, else as bytes,
// so every dtype moves.
struct Elems {
  int64_t count;
  DType dtype;
};
Elems elems(const at::Tensor& t) {
  if (const auto d = maybe_dtype(t.scalar_type())) return {t.numel(), *d};
  return {int64_t(t.nbytes()), DType::U8};
}

// How the element math reduces `t` by `op` (both checked by the front): its
// dtype, op and element count. A bool tensor reduces as its bytes, 0 or 1, in
// uint8: SUM, MAX and BOR are a logical or (the MAX of 0 and 1), PRODUCT, MIN
// and BAND a logical and (the MIN), BXOR stays; gloo's results. A complex
// tensor (SUM or AVG) reduces as its real and imaginary parts, as
// torch.view_as_real lays them out.
struct Reduction {
  DType dtype;
  ReduceOp op;
  int64_t count;
};
Reduction reduction(const at::Tensor& t, ReduceOp op) {
  switch (t.scalar_type()) {
    case at::kComplexFloat: return {DType::F32, op, 2 * t.numel()};
    case at::kComplexDouble: return {DType::F64, op, 2 * t.numel()};
    case at::kBool: break;
    default: return {*maybe_dtype(t.scalar_type()), op, t.numel()};
  }
  switch (op) {
    case ReduceOp::SUM: case ReduceOp::MAX: case ReduceOp::BOR: return {DType::U8, ReduceOp::MAX, t.numel()};
    case ReduceOp::PRODUCT: case ReduceOp::MIN: case ReduceOp::BAND: return {DType::U8, ReduceOp::MIN, t.numel()};
    default: return {DType::U8, op, t.numel()};
  }
}
Reduction reduction(const at::Tensor& t, const c10d::ReduceOp& op) { return reduction(t, ReduceOp(int(op.op_))); }
char* ptr(const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }

}  // namespace

// Runs one transport call, translating its errors (engine.h: run_transport).
#define FASTPAR_RUN(...) run_transport([&] { __VA_ARGS__; })

ShmEngine::ShmEngine(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::vector<int> global_ranks,
                     const cpu_shm::ShmOptions& options, const cpu_shm::ShmTuning& tuning)
    : Engine(rank, size), tuning_(tuning), placement_(tuning.placement), timeout_(options.timeout) {
  cpu_shm::Rendezvous rv;
  rv.set = [store](const std::string& k, const std::string& v) {
    store->set(k, std::vector<uint8_t>(v.begin(), v.end()));
  };
  rv.get = [store](const std::string& k) {
    const auto v = store->get(k);
    return std::string(v.begin(), v.end());
  };
  rv.check = [store](const std::string& k) { return store->check({k}); };
  try {
    comm_ = std::make_shared<cpu_shm::ShmComm>(rank, size, std::move(global_ranks), rv, options);
  } catch (const std::exception& e) {
    C10_THROW_ERROR(DistBackendError, e.what());
  }
  p2p_ = std::make_shared<cpu_shm::ShmP2P>(comm_);
}

void ShmEngine::abort_with(const std::string& reason) {
  std::lock_guard<std::mutex> g(mu_);
  comm_->abort_with(reason);
}

std::unique_lock<std::mutex> ShmEngine::start(std::chrono::milliseconds t) {
  std::unique_lock<std::mutex> g(mu_);
  comm_->set_timeout(call_timeout(t, timeout_));
  return g;
}

void ShmEngine::allreduce_direct(at::Tensor& t, const c10d::AllreduceOptions& opts) {
  auto g = start(opts.timeout);
  const Reduction r = reduction(t, ReduceOp(int(opts.reduceOp.op_)));
  FASTPAR_RUN(cpu_shm::allreduce(*comm_, tuning_, placement_, t.data_ptr(), t.data_ptr(), r.count, r.dtype, r.op));
}

c10::intrusive_ptr<c10d::Work> ShmEngine::allreduce(std::vector<at::Tensor>& tensors,
                                                    const c10d::AllreduceOptions& opts) {
  const at::Tensor& t = tensors[0];
  auto g = start(opts.timeout);
  const Reduction r = reduction(t, ReduceOp(int(opts.reduceOp.op_)));
  FASTPAR_RUN(cpu_shm::allreduce(*comm_, tuning_, placement_, t.data_ptr(), t.data_ptr(), r.count, r.dtype, r.op));
  return recycle(spare_allreduce_, c10d::OpType::ALLREDUCE, tensors);
}

c10::intrusive_ptr<c10d::Work> ShmEngine::broadcast(std::vector<at::Tensor>& tensors,
                                                    const c10d::BroadcastOptions& opts) {
  const at::Tensor& t = tensors[0];
  const Elems e = elems(t);
  auto g = start(opts.timeout);
  FASTPAR_RUN(cpu_shm::broadcast(*comm_, t.data_ptr(), e.count, e.dtype, int(opts.rootRank)));
  return done(c10d::OpType::BROADCAST, tensors);
}

c10::intrusive_ptr<c10d::Work> ShmEngine::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  const at::Tensor& t = tensors[0];
  auto g = start(opts.timeout);
  // Non-roots pass their input as `out`: cpu_shm::reduce writes only the root's.
  const Reduction r = reduction(t, opts.reduceOp);
  FASTPAR_RUN(cpu_shm::reduce(*comm_, t.data_ptr(), t.data_ptr(), r.count, r.dtype, r.op, int(opts.rootRank)));
  return done(c10d::OpType::REDUCE, tensors);
}

c10::intrusive_ptr<c10d::Work> ShmEngine::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& inputs,
                                                    const c10d::AllgatherOptions& opts) {
  const Elems e = elems(inputs[0]);
  std::vector<void*> outs;
  for (auto& o : outputs[0]) outs.push_back(o.data_ptr());
  auto g = start(opts.timeout);
  FASTPAR_RUN(cpu_shm::gather(*comm_, inputs[0].data_ptr(), outs.data(), e.count, e.dtype, -1));
  return done(c10d::OpType::ALLGATHER, outputs[0]);
}

c10::intrusive_ptr<c10d::Work> ShmEngine::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                          const c10d::AllgatherOptions& opts) {
  const Elems e = elems(input);
  const int64_t bytes = int64_t(input.nbytes());
  std::vector<void*> outs;
  for (int q = 0; q < getSize(); ++q) outs.push_back(ptr(output) + q * bytes);
  auto g = start(opts.timeout);
  FASTPAR_RUN(cpu_shm::gather(*comm_, input.data_ptr(), outs.data(), e.count, e.dtype, -1));
  return done(c10d::OpType::_ALLGATHER_BASE, {output});
}

c10::intrusive_ptr<c10d::Work> ShmEngine::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                 std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  const Elems e = elems(inputs[0]);
  std::vector<void*> outs;
  if (getRank() == opts.rootRank)
    for (auto& o : outputs[0]) outs.push_back(o.data_ptr());
  auto g = start(opts.timeout);
  FASTPAR_RUN(cpu_shm::gather(*comm_, inputs[0].data_ptr(), outs.empty() ? nullptr : outs.data(), e.count, e.dtype,
                              int(opts.rootRank)));
  return done(c10d::OpType::GATHER, outputs.empty() ? std::vector<at::Tensor>{} : outputs[0]);
}

c10::intrusive_ptr<c10d::Work> ShmEngine::scatter(std::vector<at::Tensor>& outputs,
                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                  const c10d::ScatterOptions& opts) {
  const Elems e = elems(outputs[0]);
  std::vector<const void*> ins;
  if (getRank() == opts.rootRank)
    for (auto& i : inputs[0]) ins.push_back(i.const_data_ptr());
  auto g = start(opts.timeout);
  FASTPAR_RUN(cpu_shm::scatter(*comm_, ins.empty() ? nullptr : ins.data(), outputs[0].data_ptr(), e.count, e.dtype,
                               int(opts.rootRank)));
  return done(c10d::OpType::SCATTER, outputs);
}

c10::intrusive_ptr<c10d::Work> ShmEngine::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                               const c10d::ReduceScatterOptions& opts) {
  const Reduction r = reduction(output, opts.reduceOp);
  auto g = start(opts.timeout);
  FASTPAR_RUN(cpu_shm::reduce_scatter(*comm_, input.data_ptr(), output.data_ptr(), r.count, r.dtype, r.op));
  return done(c10d::OpType::_REDUCE_SCATTER_BASE, {output});
}

c10::intrusive_ptr<c10d::Work> ShmEngine::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                        std::vector<int64_t>& output_split_sizes,
                                                        std::vector<int64_t>& input_split_sizes,
                                                        const c10d::AllToAllOptions& opts) {
  // Counts in elements of `dt`: bytes for dtypes without element math.
  const Elems e = elems(input);
  const int64_t scale = e.dtype == DType::U8 && input.element_size() != 1 ? int64_t(input.element_size()) : 1;
  const int n = getSize();
  std::vector<int64_t> ic = checks::splits("input", input_split_sizes, input, n);
  std::vector<int64_t> oc = checks::splits("output", output_split_sizes, output, n);
  std::vector<int64_t> io(n, 0), oo(n, 0);
  for (int q = 0; q < n; ++q) {
    ic[q] *= scale;
    oc[q] *= scale;
  }
  for (int q = 1; q < n; ++q) {
    io[q] = io[q - 1] + ic[q - 1];
    oo[q] = oo[q - 1] + oc[q - 1];
  }
  auto g = start(opts.timeout);
  FASTPAR_RUN(cpu_shm::alltoall(*comm_, input.data_ptr(), io.data(), ic.data(), output.data_ptr(), oo.data(),
                                oc.data(), e.dtype));
  return done(c10d::OpType::ALLTOALL_BASE, {output});
}

c10::intrusive_ptr<c10d::Work> ShmEngine::barrier(const c10d::BarrierOptions& opts) {
  auto g = start(opts.timeout);
  FASTPAR_RUN(cpu_shm::barrier(*comm_));
  return done(c10d::OpType::BARRIER, {});
}

at::Tensor ShmEngine::registered_empty(const std::vector<int64_t>& sizes, at::ScalarType dtype, int /*device*/) {
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  const int64_t bytes = numel * int64_t(c10::elementSize(dtype));
  int64_t off = -1;
  {
    auto g = start(std::chrono::milliseconds(0));
    FASTPAR_RUN(off = cpu_shm::register_alloc(*comm_, bytes));
  }
  std::shared_ptr<cpu_shm::ShmComm> comm = comm_;  // the tensor keeps the mapping alive
  return at::from_blob(
      comm_->arena(comm_->rank()) + off, sizes, [comm, off](void*) { comm->arena_free(off); },
      at::TensorOptions().dtype(dtype).device(at::kCPU));
}

bool ShmEngine::is_registered(const at::Tensor& t) const {
  return t.defined() && t.device().is_cpu() && comm_->arena_offset(t.data_ptr(), int64_t(t.nbytes())) >= 0;
}

void ShmEngine::set_allreduce_tuning(int64_t one_shot_max_bytes, int algo) {
  std::lock_guard<std::mutex> g(mu_);
  tuning_.one_shot_max_bytes = one_shot_max_bytes;
  tuning_.algo = cpu_shm::AllreduceAlgo(algo);
}

cpu_shm::PlacementReport ShmEngine::placement() const {
  std::lock_guard<std::mutex> g(mu_);
  return placement_.report();
}

void ShmEngine::set_placement(cpu_shm::PlacementMode mode) {
  std::lock_guard<std::mutex> g(mu_);
  placement_.set_mode(mode);
}

void ShmEngine::mark_placement_drifted() {
  std::lock_guard<std::mutex> g(mu_);
  placement_.mark_drifted();
}

void ShmEngine::set_placement_test_hooks(double near_us, double far_us, double noise_us, int64_t revisit_calls) {
  std::lock_guard<std::mutex> g(mu_);
  placement_.set_test_hooks(near_us, far_us, noise_us, revisit_calls);
}

void register_shm_engine(pybind11::module& m) {
  namespace py = pybind11;
  py::class_<ShmEngine, Engine, c10::intrusive_ptr<ShmEngine>>(m, "ShmEngine", R"(
The engine for CPU tensors among one host's ranks: every collective and point
to point over shared memory. `rank` and `size` are this host's (local) ones,
`global_ranks[i]` the torch rank of its i-th rank (for messages); `store` is
the host's. Creating it is collective over the host's ranks (each maps every
peer's segment); the FASTPAR_SHM_* knobs are read then.)")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::vector<int> global_ranks,
                       int64_t timeout_ms) {
             TORCH_CHECK_VALUE(global_ranks.size() == size_t(size), "fastpar: global_ranks has ", global_ranks.size(),
                               " entries but the host has ", size, " ranks");
             const ShmKnobs knobs = shm_knobs(std::chrono::milliseconds(timeout_ms));
             return c10::make_intrusive<ShmEngine>(store, rank, size, std::move(global_ranks), knobs.options,
                                                   knobs.tuning);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("global_ranks"), py::arg("timeout_ms"),
           py::call_guard<py::gil_scoped_release>());
}

}  // namespace distributed
}  // namespace fastpar
