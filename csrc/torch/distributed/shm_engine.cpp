#include "shm_engine.h"

#include <ATen/core/ivalue.h>

#include "../dtypes.h"  // maybe_dtype
#include "bindings.h"
#include "checks.h"
#include "knobs.h"  // shm_knobs

namespace fastpar {
namespace distributed {

namespace {

// A collective that already ran: wait() returns at once and get_future() is
// completed with the output tensors, as torch's works are once finished. The
// future is built on first request: DDP asks for it, dist.all_reduce does not.
// One output (every in-place collective) is held without a vector: the list
// result() returns is built when asked for, so the common call allocates only
// this object.
class DoneWork : public c10d::Work {
 public:
  DoneWork(c10d::OpType type, const std::vector<at::Tensor>& outputs) : Work(-1, type) {
    fill(outputs);
    completed_ = true;
  }
  DoneWork(c10d::OpType type, const at::Tensor& output) : Work(-1, type) {
    fill(output);
    completed_ = true;
  }
  // Makes this Work that of another call of the same op. Only while nobody
  // else holds it (recycle() checks): no one can see it change.
  void refill(const at::Tensor& output) {
    fill(output);
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
    if (outputs.size() == 1) return fill(outputs[0]);
    single_ = false;
    one_ = at::Tensor();
    many_ = outputs;
  }
  void fill(const at::Tensor& output) {
    single_ = true;
    one_ = output;
    many_.clear();
  }
  std::vector<at::Tensor> outputs() const { return single_ ? std::vector<at::Tensor>{one_} : many_; }
  bool single_ = false;
  at::Tensor one_;
  std::vector<at::Tensor> many_;
  std::mutex future_mu_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

Work done(c10d::OpType type, const std::vector<at::Tensor>& outputs) {
  return c10::make_intrusive<DoneWork>(type, outputs);
}
Work done(c10d::OpType type, const at::Tensor& output) { return c10::make_intrusive<DoneWork>(type, output); }

// `spare` again, refilled with `output`, if only `spare` holds it (no
// caller, no weak reference); else a new DoneWork, which becomes the spare.
Work recycle(Work& spare, c10d::OpType type, const at::Tensor& output) {
  if (spare && spare.use_count() == 1 && spare.weak_use_count() == 1) {
    static_cast<DoneWork*>(spare.get())->refill(output);
    return spare;
  }
  spare = done(type, output);
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

void ShmEngine::all_reduce_now(at::Tensor& t, const Call& c) {
  auto g = start(c.timeout);
  const Reduction r = reduction(t, c.op);
  FASTPAR_RUN(cpu_shm::allreduce(*comm_, tuning_, placement_, t.data_ptr(), t.data_ptr(), r.count, r.dtype, r.op));
}

Work ShmEngine::all_reduce(at::Tensor& t, const Call& c) {
  auto g = start(c.timeout);
  const Reduction r = reduction(t, c.op);
  FASTPAR_RUN(cpu_shm::allreduce(*comm_, tuning_, placement_, t.data_ptr(), t.data_ptr(), r.count, r.dtype, r.op));
  return recycle(spare_allreduce_, c10d::OpType::ALLREDUCE, t);
}

Work ShmEngine::broadcast(at::Tensor& t, const Call& c) {
  const Elems e = elems(t);
  auto g = start(c.timeout);
  FASTPAR_RUN(cpu_shm::broadcast(*comm_, t.data_ptr(), e.count, e.dtype, c.root));
  return done(c10d::OpType::BROADCAST, t);
}

Work ShmEngine::reduce(at::Tensor& t, const Call& c) {
  auto g = start(c.timeout);
  // Non-roots pass their input as `out`: cpu_shm::reduce writes only the root's.
  const Reduction r = reduction(t, c.op);
  FASTPAR_RUN(cpu_shm::reduce(*comm_, t.data_ptr(), t.data_ptr(), r.count, r.dtype, r.op, c.root));
  return done(c10d::OpType::REDUCE, t);
}

Work ShmEngine::all_gather(std::vector<at::Tensor>& outs, at::Tensor& in, const Call& c) {
  const Elems e = elems(in);
  std::vector<void*> ptrs;
  for (auto& o : outs) ptrs.push_back(o.data_ptr());
  auto g = start(c.timeout);
  FASTPAR_RUN(cpu_shm::gather(*comm_, in.data_ptr(), ptrs.data(), e.count, e.dtype, -1));
  return done(c10d::OpType::ALLGATHER, outs);
}

// Straight into each rank's block of the flat outputs, pair by pair.
Work ShmEngine::all_gather_into(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins, const Call& c) {
  auto g = start(c.timeout);
  std::vector<void*> ptrs(static_cast<size_t>(size()));
  for (size_t i = 0; i < ins.size(); ++i) {
    const Elems e = elems(ins[i]);
    const int64_t bytes = int64_t(ins[i].nbytes());
    for (int q = 0; q < size(); ++q) ptrs[size_t(q)] = ptr(outs[i]) + q * bytes;
    FASTPAR_RUN(cpu_shm::gather(*comm_, ins[i].data_ptr(), ptrs.data(), e.count, e.dtype, -1));
  }
  return outs.size() == 1 ? done(c10d::OpType::_ALLGATHER_BASE, outs[0]) : done(kAllgatherIntoTensorCoalesced, outs);
}

Work ShmEngine::gather(std::vector<at::Tensor>& outs, at::Tensor& in, const Call& c) {
  const Elems e = elems(in);
  std::vector<void*> ptrs;
  for (auto& o : outs) ptrs.push_back(o.data_ptr());
  auto g = start(c.timeout);
  FASTPAR_RUN(cpu_shm::gather(*comm_, in.data_ptr(), ptrs.empty() ? nullptr : ptrs.data(), e.count, e.dtype, c.root));
  return done(c10d::OpType::GATHER, outs);
}

Work ShmEngine::scatter(at::Tensor& out, std::vector<at::Tensor>& ins, const Call& c) {
  const Elems e = elems(out);
  std::vector<const void*> ptrs;
  for (auto& i : ins) ptrs.push_back(i.const_data_ptr());
  auto g = start(c.timeout);
  FASTPAR_RUN(cpu_shm::scatter(*comm_, ptrs.empty() ? nullptr : ptrs.data(), out.data_ptr(), e.count, e.dtype, c.root));
  return done(c10d::OpType::SCATTER, out);
}

Work ShmEngine::reduce_scatter(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins, const Call& c) {
  auto g = start(c.timeout);
  for (size_t i = 0; i < outs.size(); ++i) {
    const Reduction r = reduction(outs[i], c.op);
    FASTPAR_RUN(cpu_shm::reduce_scatter(*comm_, ins[i].data_ptr(), outs[i].data_ptr(), r.count, r.dtype, r.op));
  }
  return outs.size() == 1 ? done(c10d::OpType::_REDUCE_SCATTER_BASE, outs[0])
                          : done(kReduceScatterTensorCoalesced, outs);
}

Work ShmEngine::all_to_all(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits,
                           std::vector<int64_t>& in_splits, const Call& c) {
  // Counts in elements of `dt`: bytes for dtypes without element math.
  const Elems e = elems(in);
  const int64_t scale = e.dtype == DType::U8 && in.element_size() != 1 ? int64_t(in.element_size()) : 1;
  const int n = size();
  std::vector<int64_t> ic = checks::splits("input", in_splits, in, n);
  std::vector<int64_t> oc = checks::splits("output", out_splits, out, n);
  std::vector<int64_t> io(n, 0), oo(n, 0);
  for (int q = 0; q < n; ++q) {
    ic[q] *= scale;
    oc[q] *= scale;
  }
  for (int q = 1; q < n; ++q) {
    io[q] = io[q - 1] + ic[q - 1];
    oo[q] = oo[q - 1] + oc[q - 1];
  }
  auto g = start(c.timeout);
  FASTPAR_RUN(cpu_shm::alltoall(*comm_, in.data_ptr(), io.data(), ic.data(), out.data_ptr(), oo.data(), oc.data(),
                                e.dtype));
  return done(c10d::OpType::ALLTOALL_BASE, out);
}

Work ShmEngine::barrier(const Call& c) {
  auto g = start(c.timeout);
  FASTPAR_RUN(cpu_shm::barrier(*comm_));
  return done(c10d::OpType::BARRIER, std::vector<at::Tensor>{});
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

void ShmEngine::set_placement_test_hooks(double near_us, double far_us, double noise_us, int64_t revisit_calls,
                                         int64_t recheck_calls) {
  std::lock_guard<std::mutex> g(mu_);
  placement_.set_test_hooks(near_us, far_us, noise_us, revisit_calls, recheck_calls);
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
