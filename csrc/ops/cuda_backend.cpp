#include "cuda_backend.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdlib>
#include <optional>

#include "../transport/cuda_ipc/allreduce_ipc.h"
#include "../transport/cuda_ipc/route.h"
#include "call_timeout.h"
#include "checks.h"
#include "cuda_ipc_rendezvous.h"
#include "cuda_ipc_work.h"

namespace fastpar {
namespace ops {
namespace {

int64_t env_bytes(const char* name, int64_t dflt, int64_t min) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return dflt;
  int64_t out = 0;
  TORCH_CHECK_VALUE(cuda_ipc::parse_byte_count(v, &out) && out >= min, "fastpar: ", name, " is '", v,
                    "' but must be a byte count (decimal digits) >= ", min);
  return out;
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0' || std::string(v) == "0") return false;
  TORCH_CHECK_VALUE(std::string(v) == "1", "fastpar: ", name, " is '", v, "' but must be 0 or 1");
  return true;
}


// The teardown barrier waits this long at most: peers that are not there by
// then are gone or stuck, and the arena is left to the driver instead.
constexpr std::chrono::milliseconds kFarewellMax{10000};

}  // namespace

CudaBackend::CudaBackend(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                         std::chrono::milliseconds timeout, c10::intrusive_ptr<c10d::Backend> fallback,
                         std::string ipc_off_reason)
    : Backend(rank, size),
      store_(std::move(store)),
      fallback_(std::move(fallback)),
      timeout_(timeout),
      ipc_off_reason_(std::move(ipc_off_reason)),
      max_ipc_bytes_(env_bytes("FASTPAR_CUDA_IPC_MAX_BYTES", cuda_ipc::kDefaultMaxIpcBytes, 0)),
      slot_bytes_(env_bytes("FASTPAR_CUDA_IPC_SLOT_BYTES", cuda_ipc::kDefaultSlotBytes, 4096)),
      blocking_wait_(env_flag("FASTPAR_BLOCKING_WAIT")) {
  TORCH_CHECK_VALUE(fallback_, "fastpar.CudaBackend: fallback is None but a backend for CUDA tensors is required");
}

CudaBackend::~CudaBackend() { release_ipc(/*farewell=*/false); }

c10::intrusive_ptr<c10d::Backend::Options> CudaBackend::getBackendOptions() {
  return c10::make_intrusive<Options>("fastpar", timeout_);
}

void CudaBackend::setTimeout(std::chrono::milliseconds timeout) {
  {
    std::lock_guard<std::mutex> g(mu_);
    timeout_ = timeout;
  }
  fallback_->setTimeout(timeout);
}

void CudaBackend::shutdown() {
  {
    std::lock_guard<std::mutex> g(mu_);
    release_ipc(/*farewell=*/true);
  }
  fallback_->shutdown();
}

void CudaBackend::abort() {
  // No device synchronization here: abort must not wait for kernels that may
  // be spinning on a dead peer. The arena stays mapped until the process exits.
  fallback_->abort();
}

void CudaBackend::release_ipc(bool farewell) noexcept {
  if (!ep_) return;
  std::shared_ptr<cuda_ipc::IpcEndpoint> ep = std::move(ep_);
  why_not_ = "shut down";
  // After disconnect() our kernels are done (they end at the latest at their
  // flag-wait timeout); peers may still read our arena until they are done too.
  const bool all_done = ep->disconnect() == cudaSuccess && farewell &&
                        ipc_farewell(*store_, getRank(), getSize(), std::min(timeout_, kFarewellMax));
  if (all_done) {
    ep->free_arena();
  } else {
    ep->abandon_arena();
  }
  cudaGetLastError();
}

void CudaBackend::set_up(int device) {
  device_ = device;
  // Once, even if it throws: the Store keys of a setup are used only once, and
  // a failed setup (a rank missing, knobs differing) leaves the group on the
  // fallback rather than retrying against stale keys.
  set_up_ = true;
  if (!ipc_off_reason_.empty()) {
    why_not_ = ipc_off_reason_;
    return;
  }
  if (getSize() > cuda_ipc::kMaxIpcRanks) {
    why_not_ = "the group has " + std::to_string(getSize()) + " ranks, more than the " +
               std::to_string(cuda_ipc::kMaxIpcRanks) + " CUDA IPC handles";
    return;
  }
  IpcRendezvous rv;
  try {
    rv = ipc_rendezvous(*store_, getRank(), getSize(), device, max_ipc_bytes_, slot_bytes_, timeout_);
  } catch (const std::exception& e) {
    why_not_ = std::string("setup failed: ") + e.what();
    throw;
  }
  ep_ = std::move(rv.endpoint);
  why_not_ = std::move(rv.why_not);
}

std::string CudaBackend::ipc_state() const {
  std::lock_guard<std::mutex> g(mu_);
  if (!set_up_) return "not set up";
  if (ep_) return "ipc on cuda:" + std::to_string(device_);
  return "fallback: " + why_not_;
}

c10::intrusive_ptr<c10d::Work> CudaBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::AllreduceOptions& opts) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "fastpar.all_reduce: expected exactly one tensor in tensors (one per "
                    "process), got ", tensors.size());
  at::Tensor& t = tensors[0];
  TORCH_CHECK_VALUE(t.defined() && t.is_cuda(), "fastpar.all_reduce: tensors[0] is ",
                    t.defined() ? "on device '" + t.device().str() + "'" : std::string("undefined"),
                    " but fastpar's CUDA backend handles CUDA tensors only");
  std::unique_lock<std::mutex> g(mu_);
  if (!set_up_) set_up(t.get_device());
  if (ep_) {
    TORCH_CHECK_VALUE(t.get_device() == device_, "fastpar.all_reduce: tensors[0] is on 'cuda:", int(t.get_device()),
                      "' but this group's CUDA IPC communicator on this rank is on 'cuda:", device_,
                      "' (the device of its first CUDA all_reduce; one GPU per rank)");
  }
  const std::optional<DType> dt = maybe_dtype(t.scalar_type());
  const int op_value = int(opts.reduceOp.op_);
  cuda_ipc::RouteQuery q;
  q.peer_access_agreed = bool(ep_);
  q.nbytes = int64_t(t.nbytes());
  q.dtype_supported = dt.has_value();
  q.op_supported = dt.has_value() && op_value >= 0 && op_value <= 4 && op_supports_dtype(ReduceOp(op_value), *dt);
  q.contiguous = t.is_contiguous();
  q.on_rank_device = t.get_device() == device_;
  q.world_size = getSize();
  q.max_ipc_bytes = max_ipc_bytes_;
  if (cuda_ipc::route_allreduce(q) == cuda_ipc::Route::kFallback) {
    g.unlock();
    ++fallback_calls_;
    return fallback_->allreduce(tensors, opts);
  }

  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  // A failure recorded by an earlier call makes the communicator unusable:
  // its phase numbers no longer match the peers'.
  throw_if_ipc_failed(*ep_, "all_reduce", getRank(), timeout);
  ++ipc_calls_;
  c10::cuda::CUDAGuard guard(t.device());
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(t.get_device());
  cuda_ipc::IpcComm& c = ep_->comm();
  if (t.numel() > 0 && getSize() > 1) {
    c.timeout_ns = uint64_t(timeout.count()) * 1000 * 1000;
    const ReduceOp rop = ReduceOp(op_value);
    if (cuda_ipc::prefer_one_shot(q.nbytes, c)) {
      C10_CUDA_CHECK(cuda_ipc::allreduce_one_shot(c, *dt, rop, t.const_data_ptr(), t.data_ptr(), t.numel(), stream));
    } else {
      C10_CUDA_CHECK(cuda_ipc::allreduce_two_shot(c, *dt, rop, t.const_data_ptr(), t.data_ptr(), t.numel(), stream));
    }
  }
  return c10::make_intrusive<IpcAllreduceWork>(tensors, stream, ep_, getRank(), timeout, blocking_wait_);
}

// ---------------------------------------------------------------- fallback

c10::intrusive_ptr<c10d::Work> CudaBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                      const c10d::BroadcastOptions& opts) {
  return fallback_->broadcast(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                const c10d::AllreduceCoalescedOptions& opts) {
  ++fallback_calls_;
  return fallback_->allreduce_coalesced(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::reduce(std::vector<at::Tensor>& tensors,
                                                   const c10d::ReduceOptions& opts) {
  return fallback_->reduce(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllgatherOptions& opts) {
  return fallback_->allgather(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                            const c10d::AllgatherOptions& opts) {
  return fallback_->_allgather_base(output, input, opts);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                std::vector<at::Tensor>& inputs,
                                                                const c10d::AllgatherOptions& opts) {
  return fallback_->allgather_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                            std::vector<at::Tensor>& inputs,
                                                                            const c10d::AllgatherOptions& opts) {
  return fallback_->allgather_into_tensor_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                   std::vector<at::Tensor>& inputs,
                                                   const c10d::GatherOptions& opts) {
  return fallback_->gather(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::scatter(std::vector<at::Tensor>& outputs,
                                                    std::vector<std::vector<at::Tensor>>& inputs,
                                                    const c10d::ScatterOptions& opts) {
  return fallback_->scatter(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                           std::vector<std::vector<at::Tensor>>& inputs,
                                                           const c10d::ReduceScatterOptions& opts) {
  return fallback_->reduce_scatter(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                 const c10d::ReduceScatterOptions& opts) {
  return fallback_->_reduce_scatter_base(output, input, opts);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                            std::vector<at::Tensor>& inputs,
                                                                            const c10d::ReduceScatterOptions& opts) {
  return fallback_->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                          std::vector<int64_t>& output_split_sizes,
                                                          std::vector<int64_t>& input_split_sizes,
                                                          const c10d::AllToAllOptions& opts) {
  return fallback_->alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllToAllOptions& opts) {
  return fallback_->alltoall(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  return fallback_->send(tensors, dst_rank, tag);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  return fallback_->recv(tensors, src_rank, tag);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return fallback_->recvAnysource(tensors, tag);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::barrier(const c10d::BarrierOptions& opts) {
  return fallback_->barrier(opts);
}

void register_cuda_backend(pybind11::module& m) {
  namespace py = pybind11;
  py::module::import("torch._C._distributed_c10d");  // registers c10d::Backend with pybind first
  py::class_<CudaBackend, c10d::Backend, c10::intrusive_ptr<CudaBackend>>(m, "CudaBackend", R"(
fastpar's backend for CUDA tensors: all_reduce over CUDA IPC where eligible,
everything else through `fallback` (NCCL). Created by fastpar.distributed and
held by the group's ShmBackend, which forwards CUDA tensors to it.)")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, int64_t timeout_ms,
                       const c10::intrusive_ptr<c10d::Backend>& fallback, std::string ipc_off_reason) {
             return c10::make_intrusive<CudaBackend>(store, rank, size, std::chrono::milliseconds(timeout_ms),
                                                     fallback, std::move(ipc_off_reason));
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_ms"), py::arg("fallback"),
           py::arg("ipc_off_reason") = std::string(), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("ipc_state", &CudaBackend::ipc_state)
      .def_property_readonly("ipc_calls", &CudaBackend::ipc_calls)
      .def_property_readonly("fallback_calls", &CudaBackend::fallback_calls)
      .def_property_readonly("max_ipc_bytes", &CudaBackend::max_ipc_bytes)
      .def_property_readonly("blocking_wait", &CudaBackend::blocking_wait)
      .def_property_readonly("fallback", &CudaBackend::fallback);
}

}  // namespace ops
}  // namespace fastpar
