// CudaEngine's lifecycle (knobs, the lazy or eager IPC setup, teardown,
// abort), its state, the routing helpers every call starts with, and its
// Python type. The collectives: cuda_engine_collectives.cpp; point to point
// and all-to-all: cuda_engine_p2p.cpp.
#include "cuda_engine.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/safe_numerics.h>

#include <algorithm>
#include <cstdlib>
#include <optional>

#include "../../core/executors/cuda_ipc/ipc_allreduce.h"
#include "../../core/executors/cuda_ipc/preload_kernels.h"
#include "bindings.h"
#include "route.h"
#include "../../core/transport/cuda_p2p/handle_cache.h"
#include "cuda_ipc_rendezvous.h"
#include "cuda_ipc_work.h"

namespace fastpar {
namespace distributed {
namespace {

// The teardown barrier waits this long at most: peers that are not there by
// then are gone or stuck, and the arena is left to the driver instead.
constexpr std::chrono::milliseconds kFarewellMax{10000};

// cudaDevAttrMpsEnabled (CUDA 12.x and later) by number, so that the build
// does not depend on the toolkit's header having it; an older driver answers
// cudaErrorInvalidValue, read as "unknown".
constexpr int kDevAttrMpsEnabled = 133;

cuda_ipc::Mps query_mps(int device) {
  int v = 0;
  const bool ok = cudaDeviceGetAttribute(&v, static_cast<cudaDeviceAttr>(kDevAttrMpsEnabled), device) == cudaSuccess;
  if (!ok) cudaGetLastError();
  return cuda_ipc::mps_from_attribute(ok, v);
}

}  // namespace

CudaEngine::CudaEngine(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::chrono::milliseconds timeout,
                       c10::intrusive_ptr<c10d::Backend> fallback, const CudaKnobs& knobs)
    : Engine(rank, size),
      store_(std::move(store)),
      fallback_(c10d_engine(std::move(fallback), rank, /*between_hosts=*/false)),
      timeout_(timeout),
      max_ipc_bytes_(knobs.ipc_max_bytes),
      slot_bytes_(knobs.ipc_slot_bytes),
      blocking_wait_(knobs.blocking_wait),
      fused_two_shot_{knobs.ipc_fused_two_shot.value_or(false)},
      fused_collectives_{knobs.ipc_fused_collectives.value_or(false)},
      registered_(std::make_shared<RegisteredArena>(knobs.registered_bytes)),
      one_shot_max_bytes_(knobs.ipc_one_shot_max_bytes) {
  TORCH_CHECK_VALUE(fallback_, "fastpar.CudaEngine: fallback is None but a backend for CUDA tensors is required");
}

CudaEngine::~CudaEngine() {
  release_ipc(/*farewell=*/false);
  drop_without_gil(fallback_);  // NCCL's destructor joins its watchdog thread
}

void CudaEngine::set_timeout(std::chrono::milliseconds timeout) {
  {
    std::lock_guard<std::mutex> g(mu_);
    timeout_ = timeout;
  }
  fallback_->set_timeout(timeout);
}

void CudaEngine::shutdown() {
  {
    std::lock_guard<std::mutex> g(mu_);
    release_ipc(/*farewell=*/true);
  }
  fallback_->shutdown();
}

void CudaEngine::abort() {
  // No device synchronization and no mu_ here: abort must not wait for
  // kernels that may be spinning on a dead peer, nor for a call holding mu_
  // while it enqueues. The host abort word stops this rank's waiting kernels
  // at once, and their control-block abort word the peers'. The arena stays
  // mapped until the process exits.
  const std::shared_ptr<IpcLink> link = std::atomic_load(&link_);
  if (link) {
    link->aborted.store(true);
    link->ep->raise_host_abort(uint32_t(flags::WaitStatus::kPeerAborted));
  }
  fallback_->abort();
}

void CudaEngine::release_ipc(bool farewell) noexcept {
  std::shared_ptr<IpcLink> link = std::atomic_exchange(&link_, std::shared_ptr<IpcLink>());
  if (!link) return;
  why_not_ = "shut down";
  // Our device current (from the destructor, shutdown's thread may have none
  // set): the transport restores the device it finds around its CUDA calls,
  // and restoring "device 0" on such a thread would create a context there
  // (cudaSetDevice does since CUDA 12). c10's guard restores only a device
  // that already has one.
  std::optional<c10::cuda::CUDAGuard> guard;
  try {
    guard.emplace(c10::DeviceIndex(device_));
  } catch (const std::exception&) {
    // A broken device: the calls below fail and the arena is abandoned.
  }
  // After disconnect() our kernels are done: they end when their peers post,
  // at the latest at their flag-wait timeout, and at once when a peer died
  // (the watcher, still running here, raised the host abort word).
  const bool disconnected = link->ep->disconnect() == cudaSuccess;
  link->watcher.stop();
  // The p2p streams go back to the process's cache, never destroyed: tensors
  // recorded on them may outlive the group (cuda_p2p/handle_cache.h).
  cuda_p2p::give_back_streams(device_, own_streams_);
  own_streams_.clear();
  send_streams_.clear();
  recv_streams_.clear();
  // A dead or aborted group has no farewell to wait for: peers that are
  // still alive may read our arena, so it is abandoned, not freed.
  const bool healthy = link->watcher.dead_rank() < 0 && !link->aborted.load() && link->ep->host_status() == 0;
  const bool all_done = disconnected && farewell && healthy &&
                        ipc_farewell(*store_, rank(), size(), std::min(timeout_, kFarewellMax));
  // A registered tensor still alive lives in the arena: it stays allocated
  // (until the process exits) rather than freed under the tensor.
  if (all_done && registered_->live() == 0) {
    link->ep->free_arena();
  } else {
    link->ep->abandon_arena();
  }
  cudaGetLastError();
}

void CudaEngine::set_up(int device) {
  device_ = device;
  // The transport saves and restores the current device around its CUDA
  // calls: with the IPC device current, restoring never makes a context on
  // another GPU (cudaSetDevice creates the primary context since CUDA 12).
  c10::cuda::CUDAGuard guard{c10::DeviceIndex(device)};
  // Once, even if it throws: the Store keys of a setup are used only once, and
  // a failed setup (a rank missing, knobs differing) leaves the group on the
  // fallback rather than retrying against stale keys.
  set_up_ = true;
  if (size() > cuda_ipc::kMaxIpcRanks) {
    why_not_ = "the group has " + std::to_string(size()) + " ranks, more than the " +
               std::to_string(cuda_ipc::kMaxIpcRanks) + " CUDA IPC handles";
    return;
  }
  // Before the rendezvous (cuda_ipc/preload_kernels.h): a rank that cannot
  // load the kernels raises here, and its peers' rendezvous times out.
  const char* what = "";
  const cudaError_t loaded = cuda_ipc::preload_ipc_kernels(&what);
  if (loaded != cudaSuccess) {
    why_not_ = std::string("could not load the ") + what + " kernels (CUDA error: " + cudaGetErrorString(loaded) + ")";
    TORCH_CHECK(false, "fastpar: CUDA IPC setup on cuda:", device, ": ", why_not_, "; a build of fastpar without "
                "this GPU's architecture gives 'no kernel image is available'");
  }
  IpcRendezvous rv;
  try {
    rv = ipc_rendezvous(*store_, rank(), size(), device, max_ipc_bytes_, slot_bytes_, registered_->bytes(),
                        timeout_);
  } catch (const std::exception& e) {
    why_not_ = std::string("setup failed: ") + e.what();
    throw;
  }
  group_shares_gpu_ = rv.group_shares_gpu;
  mps_ = query_mps(device);
  if (cuda_ipc::sharing_warrants_warning(group_shares_gpu_, mps_)) {
    TORCH_WARN_ONCE("fastpar: ", cuda_ipc::gpu_sharing_note(group_shares_gpu_, mps_));
  }
  why_not_ = std::move(rv.why_not);
  if (rv.endpoint) {
    auto link = std::make_shared<IpcLink>();
    link->ep = std::move(rv.endpoint);
    link->ep->comm().gpu_sharers = rv.ranks_on_my_gpu;  // the data kernels' grids share the GPU
    link->ep->comm().fused_grid_blocks = rv.fused_grid_blocks;
    set_schedules(link->ep->comm());
    link->watch(std::move(rv.pids), rank());
    std::atomic_store(&link_, std::move(link));
  }
}

void CudaEngine::connect(int device) {
  std::lock_guard<std::mutex> g(mu_);
  if (!set_up_) set_up(device);
}


void CudaEngine::set_schedules(cuda_ipc::IpcComm& c) const {
  c.fused_two_shot = fused_two_shot_;
  c.fused_collectives = fused_collectives_;
  c.flag_form = waiter_flags_ ? cuda_ipc::FlagForm::kWaiterMemory : cuda_ipc::FlagForm::kPollPeer;
}

const char* CudaEngine::ipc_two_shot() const {
  std::lock_guard<std::mutex> g(mu_);
  return kFusedForm.name(fused_two_shot_);
}

const char* CudaEngine::ipc_collectives() const {
  std::lock_guard<std::mutex> g(mu_);
  return kFusedForm.name(fused_collectives_);
}

const char* CudaEngine::ipc_flags() const {
  std::lock_guard<std::mutex> g(mu_);
  return kFlagForm.name(waiter_flags_);
}

void CudaEngine::testing_override(const std::string& knob, const std::string& value) {
  std::lock_guard<std::mutex> g(mu_);
  if (knob == "FASTPAR_CUDA_IPC_TWO_SHOT") {
    fused_two_shot_ = !value.empty() && parse_choice(knob.c_str(), value, kFusedForm);
  } else if (knob == "FASTPAR_CUDA_IPC_COLLECTIVES") {
    fused_collectives_ = !value.empty() && parse_choice(knob.c_str(), value, kFusedForm);
  } else if (knob == "FASTPAR_CUDA_IPC_FLAGS") {
    waiter_flags_ = !value.empty() && parse_choice(knob.c_str(), value, kFlagForm);
  } else if (knob == "FASTPAR_CUDA_IPC_ONE_SHOT_MAX_BYTES") {
    int64_t bytes = -1;
    if (!value.empty()) {
      size_t used = 0;
      try {
        bytes = std::stoll(value, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      TORCH_CHECK_VALUE(used == value.size() && bytes >= 0, "fastpar: ", knob, " is '", value,
                        "' but must be a byte count >= 0, or '' for the default");
    }
    one_shot_max_bytes_ = bytes;
  } else {
    TORCH_CHECK_VALUE(false, "fastpar: the knob is '", knob, "' but must be FASTPAR_CUDA_IPC_TWO_SHOT, "
                      "FASTPAR_CUDA_IPC_COLLECTIVES, FASTPAR_CUDA_IPC_ONE_SHOT_MAX_BYTES or FASTPAR_CUDA_IPC_FLAGS");
  }
  if (auto link = std::atomic_load(&link_)) set_schedules(link->ep->comm());
}

std::string CudaEngine::ipc_state() const {
  std::lock_guard<std::mutex> g(mu_);
  if (!set_up_) return "not set up";
  const std::string note = cuda_ipc::gpu_sharing_note(group_shares_gpu_, mps_);
  if (link_) return "ipc on cuda:" + std::to_string(device_) + (note.empty() ? "" : "; " + note);
  return "fallback: " + why_not_;
}

bool CudaEngine::shares_gpu() const {
  std::lock_guard<std::mutex> g(mu_);
  return group_shares_gpu_;
}

std::string CudaEngine::mps() const {
  std::lock_guard<std::mutex> g(mu_);
  if (!set_up_) return "";
  return mps_ == cuda_ipc::Mps::kOn ? "on" : mps_ == cuda_ipc::Mps::kOff ? "off" : "unknown";
}

int CudaEngine::dead_peer() const {
  const std::shared_ptr<IpcLink> link = std::atomic_load(&link_);
  return link ? link->watcher.dead_rank() : -1;
}

cuda_ipc::RouteQuery CudaEngine::query_for(const char* op, const at::Tensor& t) {
  if (!set_up_) {
    // Setup allocates and exchanges handles through the Store: not
    // something a CUDA graph capture may contain (and a replay would skip).
    TORCH_CHECK_VALUE(!capturing(c10::cuda::getCurrentCUDAStream(t.get_device())), "fastpar.", op, ": the group's "
                      "CUDA IPC is set up at its first CUDA collective, which cannot be inside a CUDA graph capture; "
                      "run one collective before capturing, or pass device_id= to init_process_group");
    set_up(t.get_device());
  }
  if (link_) {
    TORCH_CHECK_VALUE(t.get_device() == device_, "fastpar.", op, ": the tensor is on 'cuda:", int(t.get_device()),
                      "' but this group's CUDA IPC communicator on this rank is on 'cuda:", device_,
                      "' (the device of its first CUDA collective; one GPU per rank)");
  }
  cuda_ipc::RouteQuery q;
  q.peer_access_agreed = bool(link_);
  q.nbytes = int64_t(t.nbytes());
  q.dtype_supported = true;  // byte copies; the reductions set it
  q.op_supported = true;
  q.contiguous = t.is_contiguous();
  q.on_rank_device = t.get_device() == device_;
  q.world_size = size();
  q.max_ipc_bytes = max_ipc_bytes_;
  q.fallback_usable = !group_shares_gpu_;
  return q;
}

bool CudaEngine::to_fallback(const char* op, const cuda_ipc::RouteQuery& q, std::unique_lock<std::mutex>& g) {
  const char* why = cuda_ipc::ipc_refusal(q);
  if (*why == '\0') return false;
  TORCH_CHECK_VALUE(q.fallback_usable, "fastpar.", op, ": ranks of this group share a GPU, where NCCL cannot run "
                    "(it refuses two ranks on one device), and CUDA IPC cannot serve this call: ", why);
  ++fallback_calls_;
  g.unlock();
  return true;
}

c10::cuda::CUDAStream CudaEngine::begin_ipc(const char* op, const at::Tensor& t, std::chrono::milliseconds timeout,
                                             bool capturable, bool phased) {
  return begin_ipc(op, t.get_device(), timeout, capturable, phased);
}

c10::cuda::CUDAStream CudaEngine::begin_ipc(const char* op, int device, std::chrono::milliseconds timeout,
                                             bool capturable, bool phased) {
  // A failure recorded by an earlier call makes the communicator unusable:
  // its phase numbers no longer match the peers'. A step this rank could not
  // enqueue first (its own abort word then makes the status read "aborted").
  const cudaError_t enqueue = link_->ep->enqueue_error();
  TORCH_CHECK_WITH(DistBackendError, enqueue == cudaSuccess,
                   cuda_ipc::enqueue_failure_message(op, rank(), enqueue, /*earlier=*/true));
  link_->throw_if_failed(op, rank(), timeout);
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(device);
  // A replay repeats the kernels' arguments as captured; every schedule but
  // the graphed all_reduce takes its phase numbers and slots from host
  // counters, so a replay would repeat a finished call's numbers.
  call_captured_ = capturing(stream);
  TORCH_CHECK_VALUE(capturable || !call_captured_, "fastpar.", op, ": cannot be captured in a CUDA graph over "
                    "CUDA IPC (its steps are numbered by the host at enqueue; of fastpar's IPC calls, only "
                    "all_reduce up to FASTPAR_CUDA_IPC_SLOT_BYTES = ", slot_bytes_, " bytes can be captured); "
                    "run it outside the capture");
  // The host numbers every IPC call (phase sequence, slot rounds) in the
  // order it enqueues them, and the protocol needs the GPU to run them in that
  // order: a rank posts phase p+1 only after its reads of phase p. One stream
  // gives that; calls on two streams (FSDP's all_gather and reduce_scatter
  // streams, a collective under `with torch.cuda.stream(s)`) could overlap or
  // swap, so the new stream first waits for everything the last one has
  // enqueued. A graphed all_reduce needs no order: it has its own slot and
  // device-side epochs, and a capturing stream may not wait on an event
  // recorded outside the capture.
  if (phased && !call_captured_) {
    if (last_ipc_stream_ && *last_ipc_stream_ != stream) {
      PooledEvent e = ipc_event();
      e.record(*last_ipc_stream_);
      e.block(stream);
    }
    last_ipc_stream_ = stream;
  }
  ++ipc_calls_;
  link_->ep->comm().timeout_ns = timeout_ns(timeout);
  return stream;
}

Work CudaEngine::ipc_work(c10d::OpType type, const char* op,
                                                     std::vector<at::Tensor> outputs,
                                                     const c10::cuda::CUDAStream& stream,
                                                     std::chrono::milliseconds timeout, bool host_wait) {
  return c10::make_intrusive<IpcWork>(type, op, std::move(outputs), stream, call_captured_, ipc_event(), link_,
                                      rank(), timeout, blocking_wait_ || host_wait);
}

at::Tensor CudaEngine::registered_empty(const std::vector<int64_t>& sizes, at::ScalarType dtype, int device) {
  int64_t numel = 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    TORCH_CHECK_VALUE(!c10::mul_overflows(numel, sizes[i], &numel), "fastpar.registered_empty: shape ",
                      c10::IntArrayRef(sizes), " has more elements than an int64 counts");
  }
  int64_t bytes = 0;
  TORCH_CHECK_VALUE(!c10::mul_overflows(numel, int64_t(c10::elementSize(dtype)), &bytes),
                    "fastpar.registered_empty: shape ", c10::IntArrayRef(sizes), " of ", dtype,
                    " has more bytes than an int64 counts");
  std::lock_guard<std::mutex> g(mu_);
  if (!set_up_) set_up(device);
  TORCH_CHECK_VALUE(link_, "fastpar.registered_empty: registered CUDA tensors live in the group's CUDA IPC arena, "
                    "and this group has none (", why_not_, ")");
  TORCH_CHECK_VALUE(device == device_, "fastpar.registered_empty: device is 'cuda:", device, "' but this group's "
                    "CUDA IPC communicator on this rank is on 'cuda:", device_, "'");
  TORCH_CHECK_VALUE(registered_->bytes() > 0, "fastpar.registered_empty: FASTPAR_CUDA_IPC_REGISTERED_BYTES is 0, "
                    "so the CUDA IPC arena has no room for registered tensors; set it (equal on every rank) before "
                    "the group's first CUDA collective");
  c10::cuda::CUDAGuard guard{c10::DeviceIndex(device_)};
  const c10::cuda::CUDAStream stream = begin_ipc("registered_empty", device_, timeout_);
  const int64_t off = registered_->alloc(bytes);
  cuda_ipc::IpcComm& c = link_->ep->comm();
  // An allocation answers now: wait for the agreement phase (bounded by the
  // flag-wait timeout), and raise if the ranks' offsets differ.
  const cudaError_t err = cuda_ipc::agree_registered_ipc(c, bytes, off, stream.stream());
  if (err == cudaSuccess) C10_CUDA_CHECK(cudaStreamSynchronize(stream.stream()));
  try {
    C10_CUDA_CHECK(err);
    link_->throw_if_failed("registered_empty", rank(), timeout_);
  } catch (...) {
    registered_->free(off);
    throw;
  }
  TORCH_CHECK_VALUE(off >= 0, "fastpar.registered_empty: ", bytes, " bytes do not fit in the free space of the "
                    "CUDA IPC registered arena of ", registered_->bytes(), " bytes (raise "
                    "FASTPAR_CUDA_IPC_REGISTERED_BYTES)");
  std::shared_ptr<RegisteredArena> arena = registered_;
  return at::from_blob(
      cuda_ipc::registered_of(c.bases[c.rank], c.slot_bytes) + off, sizes, [arena, off](void*) { arena->free(off); },
      at::TensorOptions().dtype(dtype).device(at::Device(at::kCUDA, c10::DeviceIndex(device_))));
}

int64_t CudaEngine::registered_offset(const at::Tensor& t) const {
  if (!link_ || !t.is_cuda() || t.get_device() != device_ || !t.is_contiguous()) return -1;
  const cuda_ipc::IpcComm& c = link_->ep->comm();
  return registered_->offset_of(t.data_ptr(), int64_t(t.nbytes()), cuda_ipc::registered_of(c.bases[c.rank],
                                                                                          c.slot_bytes));
}

bool CudaEngine::is_registered(const at::Tensor& t) const {
  std::lock_guard<std::mutex> g(mu_);
  return registered_offset(t) >= 0;
}

void CudaEngine::refuse_on_shared_gpu(const char* op) const {
  TORCH_CHECK_VALUE(!shares_gpu(), "fastpar.", op, ": ranks of this group share a GPU, where NCCL cannot run "
                    "(it refuses two ranks on one device), and this collective has no CUDA IPC schedule yet; "
                    "use CPU tensors for it (fastpar's shared-memory path) or one GPU per rank");
}

void register_cuda_engine(pybind11::module& m) {
  namespace py = pybind11;
  py::module::import("torch._C._distributed_c10d");  // registers c10d::Backend with pybind first
  py::class_<CudaEngine, Engine, c10::intrusive_ptr<CudaEngine>>(m, "CudaEngine", R"(
fastpar's engine for CUDA tensors of ranks on one host: every collective and
send/recv over CUDA IPC where the route allows (docs/cuda.md), the rest through
`fallback` (NCCL). Created by fastpar.distributed and held by the group's
fastpar._C.Backend, which hands it the checked calls on CUDA tensors.)")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, int64_t timeout_ms,
                       const c10::intrusive_ptr<c10d::Backend>& fallback) {
             return c10::make_intrusive<CudaEngine>(store, rank, size, std::chrono::milliseconds(timeout_ms),
                                                    fallback, cuda_knobs());
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_ms"), py::arg("fallback"),
           py::call_guard<py::gil_scoped_release>())
      .def("_connect", &CudaEngine::connect, py::arg("device"), "Sets CUDA IPC up now on cuda:`device` "
           "(collective; otherwise done at the group's first CUDA collective).",
           py::call_guard<py::gil_scoped_release>())
      .def("registered_empty", &CudaEngine::registered_empty, py::arg("sizes"), py::arg("dtype"), py::arg("device"),
           "An uninitialized CUDA tensor in this rank's CUDA IPC arena (collective; see "
           "fastpar.distributed.registered_empty).", py::call_guard<py::gil_scoped_release>())
      .def("is_registered", &CudaEngine::is_registered, py::arg("tensor"))
      .def_property_readonly("registered_bytes", &CudaEngine::registered_bytes)
      .def_property_readonly("ipc_state", &CudaEngine::ipc_state)
      .def("abort", &CudaEngine::abort, "Stops this rank's CUDA IPC kernels now and aborts the fallback; never "
           "blocks. The group is unusable afterwards.", py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("shares_gpu", &CudaEngine::shares_gpu)
      .def_property_readonly("mps", &CudaEngine::mps)
      .def_property_readonly("dead_peer", &CudaEngine::dead_peer)
      .def_property_readonly("ipc_calls", &CudaEngine::ipc_calls)
      .def_property_readonly("fallback_calls", &CudaEngine::fallback_calls)
      .def_property_readonly("direct_calls", &CudaEngine::direct_calls)
      .def_property_readonly("max_ipc_bytes", &CudaEngine::max_ipc_bytes)
      .def_property_readonly("one_shot_max_bytes", &CudaEngine::one_shot_max_bytes)
      .def_property_readonly("blocking_wait", &CudaEngine::blocking_wait)
      .def_property_readonly("ipc_two_shot", &CudaEngine::ipc_two_shot)
      .def_property_readonly("ipc_collectives", &CudaEngine::ipc_collectives)
      .def_property_readonly("ipc_flags", &CudaEngine::ipc_flags)
      .def_property_readonly("fallback", &CudaEngine::fallback);
  py::module_ testing = m.attr("_testing");
  testing.def(
      "cuda_override",
      [](CudaEngine& engine, const std::string& knob, const std::string& value) {
        engine.testing_override(knob, value);
      },
      py::arg("engine"), py::arg("knob"), py::arg("value"),
      "Overrides a FASTPAR_CUDA_IPC_* schedule knob of this group from its next call (value as the environment "
      "spells it, '' for the default), or FASTPAR_CUDA_IPC_FLAGS ('peer' or 'waiter', the hook only); every rank "
      "between the same calls.");
}

}  // namespace distributed
}  // namespace fastpar
