#include "cuda_backend.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstdlib>
#include <climits>
#include <functional>
#include <optional>

#include "../transport/cuda_ipc/allreduce_ipc.h"
#include "../transport/cuda_ipc/collectives_ipc.h"
#include "../transport/cuda_ipc/p2p_ipc.h"
#include "../transport/cuda_ipc/route.h"
#include "call_timeout.h"
#include "../ops/checks.h"
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

// The device a call runs on; "undefined" / "on device 'cpu'" for the errors.
std::string device_words(const at::Tensor& t) {
  return t.defined() ? "on device '" + t.device().str() + "'" : std::string("undefined");
}

void check_cuda(const char* op, const char* arg, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.defined() && t.is_cuda(), "fastpar.", op, ": ", arg, " is ", device_words(t),
                    " but fastpar's CUDA backend handles CUDA tensors only");
}

void check_like(const char* op, const std::string& arg, const at::Tensor& t, const at::Tensor& ref,
                const char* ref_name, int64_t numel) {
  TORCH_CHECK_VALUE(t.defined() && t.is_cuda(), "fastpar.", op, ": ", arg, " is ", device_words(t),
                    " but fastpar's CUDA backend handles CUDA tensors only");
  TORCH_CHECK_VALUE(t.scalar_type() == ref.scalar_type(), "fastpar.", op, ": ", arg, " has dtype ", t.scalar_type(),
                    " but ", ref_name, " has dtype ", ref.scalar_type());
  TORCH_CHECK_VALUE(t.numel() == numel, "fastpar.", op, ": ", arg, " has ", t.numel(), " elements but ", numel,
                    " are expected (", ref_name, " has ", ref.numel(), ")");
}

void check_root(const char* op, int64_t root, int size) {
  TORCH_CHECK_VALUE(root >= 0 && root < size, "fastpar.", op, ": root is ", root, " but the group has ", size,
                    " ranks (0..", size - 1, ")");
}

// `t` if contiguous, else a contiguous temporary whose copy-back into `t` is
// queued by finish_outputs (on the current stream, after the kernels).
// The tag of the messages all_to_all_pairs sends: no int tag of a user's
// send can equal it, so a user's message and an all-to-all's between the same
// two ranks can never be taken for one another.
constexpr int64_t kAllToAllTag = INT64_MIN + 1;

struct StagedOutputs {
  std::vector<at::Tensor> user, staged;
  void* add(const at::Tensor& t) {
    if (t.is_contiguous()) return t.data_ptr();
    user.push_back(t);
    staged.push_back(at::empty_like(t, at::MemoryFormat::Contiguous));
    return staged.back().data_ptr();
  }
  void finish() {
    for (size_t i = 0; i < user.size(); ++i) user[i].copy_(staged[i]);
  }
};

// Whether `op` reduces `dt` on the kernels: the route's op_supported.
bool reduces(const std::optional<DType>& dt, const c10d::ReduceOp& op) {
  const int v = int(op.op_);
  return dt.has_value() && v >= 0 && v <= 4 && op_supports_dtype(ReduceOp(v), *dt);
}

}  // namespace

CudaBackend::CudaBackend(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                         std::chrono::milliseconds timeout, c10::intrusive_ptr<c10d::Backend> fallback)
    : Backend(rank, size),
      store_(std::move(store)),
      fallback_(std::move(fallback)),
      timeout_(timeout),
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

void CudaBackend::release_ipc(bool farewell) noexcept {
  std::shared_ptr<IpcLink> link = std::atomic_exchange(&link_, std::shared_ptr<IpcLink>());
  if (!link) return;
  why_not_ = "shut down";
  // After disconnect() our kernels are done: they end when their peers post,
  // at the latest at their flag-wait timeout, and at once when a peer died
  // (the watcher, still running here, raised the host abort word).
  const bool disconnected = link->ep->disconnect() == cudaSuccess;
  link->watcher.stop();
  // A dead or aborted group has no farewell to wait for: peers that are
  // still alive may read our arena, so it is abandoned, not freed.
  const bool healthy = link->watcher.dead_rank() < 0 && !link->aborted.load() && link->ep->host_status() == 0;
  const bool all_done = disconnected && farewell && healthy &&
                        ipc_farewell(*store_, getRank(), getSize(), std::min(timeout_, kFarewellMax));
  if (all_done) {
    link->ep->free_arena();
  } else {
    link->ep->abandon_arena();
  }
  cudaGetLastError();
}

void CudaBackend::set_up(int device) {
  device_ = device;
  // Once, even if it throws: the Store keys of a setup are used only once, and
  // a failed setup (a rank missing, knobs differing) leaves the group on the
  // fallback rather than retrying against stale keys.
  set_up_ = true;
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
  group_shares_gpu_ = rv.group_shares_gpu;
  mps_ = query_mps(device);
  if (cuda_ipc::sharing_warrants_warning(group_shares_gpu_, mps_)) {
    TORCH_WARN_ONCE("fastpar: ", cuda_ipc::gpu_sharing_note(group_shares_gpu_, mps_));
  }
  why_not_ = std::move(rv.why_not);
  if (rv.endpoint) {
    auto link = std::make_shared<IpcLink>();
    link->ep = std::move(rv.endpoint);
    link->watch(std::move(rv.pids), getRank());
    std::atomic_store(&link_, std::move(link));
  }
}

void CudaBackend::connect(int device) {
  std::lock_guard<std::mutex> g(mu_);
  if (!set_up_) set_up(device);
}

std::string CudaBackend::ipc_state() const {
  std::lock_guard<std::mutex> g(mu_);
  if (!set_up_) return "not set up";
  const std::string note = cuda_ipc::gpu_sharing_note(group_shares_gpu_, mps_);
  if (link_) return "ipc on cuda:" + std::to_string(device_) + (note.empty() ? "" : "; " + note);
  return "fallback: " + why_not_;
}

bool CudaBackend::shares_gpu() const {
  std::lock_guard<std::mutex> g(mu_);
  return group_shares_gpu_;
}

std::string CudaBackend::mps() const {
  std::lock_guard<std::mutex> g(mu_);
  if (!set_up_) return "";
  return mps_ == cuda_ipc::Mps::kOn ? "on" : mps_ == cuda_ipc::Mps::kOff ? "off" : "unknown";
}

int CudaBackend::dead_peer() const {
  const std::shared_ptr<IpcLink> link = std::atomic_load(&link_);
  return link ? link->watcher.dead_rank() : -1;
}

cuda_ipc::RouteQuery CudaBackend::query_for(const char* op, const at::Tensor& t) {
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
  q.world_size = getSize();
  q.max_ipc_bytes = max_ipc_bytes_;
  q.fallback_usable = !group_shares_gpu_;
  return q;
}

void CudaBackend::to_fallback(const char* op, const cuda_ipc::RouteQuery& q) {
  TORCH_CHECK_VALUE(q.fallback_usable, "fastpar.", op, ": ranks of this group share a GPU, where NCCL cannot run "
                    "(it refuses two ranks on one device), and CUDA IPC cannot serve this call: ",
                    cuda_ipc::ipc_refusal(q));
  ++fallback_calls_;
}

c10::cuda::CUDAStream CudaBackend::begin_ipc(const char* op, const at::Tensor& t, std::chrono::milliseconds timeout,
                                             bool capturable) {
  // A failure recorded by an earlier call makes the communicator unusable:
  // its phase numbers no longer match the peers'.
  link_->throw_if_failed(op, getRank(), timeout);
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(t.get_device());
  // A replay repeats the kernels' arguments as captured; every schedule but
  // the graphed all_reduce takes its phase numbers and slots from host
  // counters, so a replay would repeat a finished call's numbers.
  TORCH_CHECK_VALUE(capturable || !capturing(stream), "fastpar.", op, ": cannot be captured in a CUDA graph over "
                    "CUDA IPC (its steps are numbered by the host at enqueue; of fastpar's IPC calls, only "
                    "all_reduce up to FASTPAR_CUDA_IPC_SLOT_BYTES = ", slot_bytes_, " bytes can be captured); "
                    "run it outside the capture");
  ++ipc_calls_;
  link_->ep->comm().timeout_ns = uint64_t(timeout.count()) * 1000 * 1000;
  return stream;
}

c10::intrusive_ptr<c10d::Work> CudaBackend::ipc_work(c10d::OpType type, const char* op,
                                                     std::vector<at::Tensor> outputs,
                                                     const c10::cuda::CUDAStream& stream,
                                                     std::chrono::milliseconds timeout) {
  return c10::make_intrusive<IpcWork>(type, op, std::move(outputs), stream, link_, getRank(), timeout,
                                      blocking_wait_);
}

// ---------------------------------------------------------------- IPC collectives

c10::intrusive_ptr<c10d::Work> CudaBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::AllreduceOptions& opts) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "fastpar.all_reduce: expected exactly one tensor in tensors (one per "
                    "process), got ", tensors.size());
  at::Tensor& t = tensors[0];
  check_cuda("all_reduce", "tensors[0]", t);
  std::unique_lock<std::mutex> g(mu_);
  cuda_ipc::RouteQuery q = query_for("all_reduce", t);
  const std::optional<DType> dt = maybe_dtype(t.scalar_type());
  q.dtype_supported = dt.has_value();
  q.op_supported = reduces(dt, opts.reduceOp);
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("all_reduce", q);
    g.unlock();
    return fallback_->allreduce(tensors, opts);
  }
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  c10::cuda::CUDAGuard guard(t.device());
  const c10::cuda::CUDAStream stream = begin_ipc("all_reduce", t, timeout, /*capturable=*/true);
  cuda_ipc::IpcComm& c = link_->ep->comm();
  if (capturing(stream)) {
    // The kernel a replay can repeat (fused_one_shot.h, "the all_reduce a
    // CUDA graph can capture"): its own flags and slot, no host counter.
    TORCH_CHECK_VALUE(q.nbytes <= slot_bytes_, "fastpar.all_reduce: a CUDA graph can capture an all_reduce over "
                      "CUDA IPC of at most FASTPAR_CUDA_IPC_SLOT_BYTES = ", slot_bytes_, " bytes, but tensors[0] has ",
                      q.nbytes, " bytes");
    if (t.numel() > 0)
      C10_CUDA_CHECK(cuda_ipc::allreduce_graphed(c, *dt, ReduceOp(int(opts.reduceOp.op_)), t.const_data_ptr(),
                                                 t.data_ptr(), t.numel(), stream));
  } else if (t.numel() > 0 && getSize() > 1) {
    const ReduceOp rop = ReduceOp(int(opts.reduceOp.op_));
    if (cuda_ipc::prefer_one_shot(q.nbytes, c)) {
      C10_CUDA_CHECK(cuda_ipc::allreduce_one_shot(c, *dt, rop, t.const_data_ptr(), t.data_ptr(), t.numel(), stream));
    } else {
      C10_CUDA_CHECK(cuda_ipc::allreduce_two_shot(c, *dt, rop, t.const_data_ptr(), t.data_ptr(), t.numel(), stream));
    }
  }
  return ipc_work(c10d::OpType::ALLREDUCE, "all_reduce", tensors, stream, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                      const c10d::BroadcastOptions& opts) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "fastpar.broadcast: expected exactly one tensor in tensors (one per "
                    "process), got ", tensors.size());
  at::Tensor& t = tensors[0];
  check_cuda("broadcast", "tensors[0]", t);
  check_root("broadcast", opts.rootRank, getSize());
  std::unique_lock<std::mutex> g(mu_);
  const cuda_ipc::RouteQuery q = query_for("broadcast", t);
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("broadcast", q);
    g.unlock();
    return fallback_->broadcast(tensors, opts);
  }
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  c10::cuda::CUDAGuard guard(t.device());
  const c10::cuda::CUDAStream stream = begin_ipc("broadcast", t, timeout);
  // Every call runs its phases, even with one rank or no bytes: the descriptor
  // check is what catches a desynced peer.
  C10_CUDA_CHECK(cuda_ipc::broadcast_ipc(link_->ep->comm(), int32_t(t.scalar_type()), t.numel(), t.data_ptr(),
                                         int64_t(t.nbytes()), int(opts.rootRank), stream));
  return ipc_work(c10d::OpType::BROADCAST, "broadcast", tensors, stream, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::reduce(std::vector<at::Tensor>& tensors,
                                                   const c10d::ReduceOptions& opts) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "fastpar.reduce: expected exactly one tensor in tensors (one per "
                    "process), got ", tensors.size());
  at::Tensor& t = tensors[0];
  check_cuda("reduce", "tensors[0]", t);
  check_root("reduce", opts.rootRank, getSize());
  std::unique_lock<std::mutex> g(mu_);
  cuda_ipc::RouteQuery q = query_for("reduce", t);
  const std::optional<DType> dt = maybe_dtype(t.scalar_type());
  q.dtype_supported = dt.has_value();
  q.op_supported = reduces(dt, opts.reduceOp);
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("reduce", q);
    g.unlock();
    return fallback_->reduce(tensors, opts);
  }
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  c10::cuda::CUDAGuard guard(t.device());
  const c10::cuda::CUDAStream stream = begin_ipc("reduce", t, timeout);
  C10_CUDA_CHECK(cuda_ipc::reduce_ipc(link_->ep->comm(), *dt, ReduceOp(int(opts.reduceOp.op_)), t.const_data_ptr(),
                                      t.data_ptr(), t.numel(), int(opts.rootRank), stream));
  return ipc_work(c10d::OpType::REDUCE, "reduce", tensors, stream, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(inputs.size() == 1 && outputs.size() == 1, "fastpar.all_gather: expected one input tensor and "
                    "one output list (one per process), got ", inputs.size(), " and ", outputs.size());
  const at::Tensor& in = inputs[0];
  check_cuda("all_gather", "input_tensor", in);
  TORCH_CHECK_VALUE(int64_t(outputs[0].size()) == getSize(), "fastpar.all_gather: tensor_list has ",
                    outputs[0].size(), " tensors but the group has ", getSize(), " ranks");
  bool same_device = true;
  for (size_t q = 0; q < outputs[0].size(); ++q) {
    const at::Tensor& o = outputs[0][q];
    check_like("all_gather", "tensor_list[" + std::to_string(q) + "]", o, in, "input_tensor", in.numel());
    same_device = same_device && o.device() == in.device();
  }
  std::unique_lock<std::mutex> g(mu_);
  // Routed by the input (what torch makes equal on every rank); outputs that
  // are not contiguous are staged.
  cuda_ipc::RouteQuery q = query_for("all_gather", in);
  q.on_rank_device = q.on_rank_device && same_device;
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("all_gather", q);
    g.unlock();
    return fallback_->allgather(outputs, inputs, opts);
  }
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  c10::cuda::CUDAGuard guard(in.device());
  const c10::cuda::CUDAStream stream = begin_ipc("all_gather", in, timeout);
  StagedOutputs staged;
  void* outs[cuda_ipc::kMaxIpcRanks];
  for (int r = 0; r < getSize(); ++r) outs[r] = staged.add(outputs[0][size_t(r)]);
  C10_CUDA_CHECK(cuda_ipc::allgather_ipc(link_->ep->comm(), int32_t(in.scalar_type()), in.numel(),
                                         in.const_data_ptr(), outs, int64_t(in.nbytes()), stream));
  staged.finish();
  return ipc_work(c10d::OpType::ALLGATHER, "all_gather", outputs[0], stream, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                            const c10d::AllgatherOptions& opts) {
  check_cuda("all_gather_into_tensor", "input_tensor", input);
  check_like("all_gather_into_tensor", "output_tensor", output, input, "input_tensor", input.numel() * getSize());
  std::unique_lock<std::mutex> g(mu_);
  cuda_ipc::RouteQuery q = query_for("all_gather_into_tensor", input);
  q.contiguous = input.is_contiguous() && output.is_contiguous();
  q.on_rank_device = q.on_rank_device && output.device() == input.device();
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("all_gather_into_tensor", q);
    g.unlock();
    return fallback_->_allgather_base(output, input, opts);
  }
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  c10::cuda::CUDAGuard guard(input.device());
  const c10::cuda::CUDAStream stream = begin_ipc("all_gather_into_tensor", input, timeout);
  void* outs[cuda_ipc::kMaxIpcRanks];
  for (int r = 0; r < getSize(); ++r) outs[r] = static_cast<char*>(output.data_ptr()) + int64_t(input.nbytes()) * r;
  C10_CUDA_CHECK(cuda_ipc::allgather_ipc(link_->ep->comm(), int32_t(input.scalar_type()), input.numel(),
                                         input.const_data_ptr(), outs, int64_t(input.nbytes()), stream));
  return ipc_work(c10d::OpType::_ALLGATHER_BASE, "all_gather_into_tensor", {output}, stream, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                            std::vector<at::Tensor>& inputs,
                                                                            const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "fastpar.all_gather_into_tensor_coalesced: ", outputs.size(),
                    " outputs but ", inputs.size(), " inputs");
  if (inputs.empty()) return fallback_->allgather_into_tensor_coalesced(outputs, inputs, opts);
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_cuda("all_gather_into_tensor_coalesced", ("inputs[" + std::to_string(i) + "]").c_str(), inputs[i]);
    check_like("all_gather_into_tensor_coalesced", "outputs[" + std::to_string(i) + "]", outputs[i], inputs[i],
               ("inputs[" + std::to_string(i) + "]").c_str(), inputs[i].numel() * getSize());
  }
  std::unique_lock<std::mutex> g(mu_);
  // One route for the whole call: every entry must qualify (the largest sets the size).
  cuda_ipc::RouteQuery q = query_for("all_gather_into_tensor_coalesced", inputs[0]);
  for (size_t i = 0; i < inputs.size(); ++i) {
    q.nbytes = std::max<int64_t>(q.nbytes, int64_t(inputs[i].nbytes()));
    q.contiguous = q.contiguous && inputs[i].is_contiguous() && outputs[i].is_contiguous();
    q.on_rank_device = q.on_rank_device && inputs[i].get_device() == device_ && outputs[i].get_device() == device_;
  }
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("all_gather_into_tensor_coalesced", q);
    g.unlock();
    return fallback_->allgather_into_tensor_coalesced(outputs, inputs, opts);
  }
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  c10::cuda::CUDAGuard guard(inputs[0].device());
  const c10::cuda::CUDAStream stream = begin_ipc("all_gather_into_tensor_coalesced", inputs[0], timeout);
  for (size_t i = 0; i < inputs.size(); ++i) {
    void* outs[cuda_ipc::kMaxIpcRanks];
    const int64_t b = int64_t(inputs[i].nbytes());
    for (int r = 0; r < getSize(); ++r) outs[r] = static_cast<char*>(outputs[i].data_ptr()) + b * r;
    C10_CUDA_CHECK(cuda_ipc::allgather_ipc(link_->ep->comm(), int32_t(inputs[i].scalar_type()), inputs[i].numel(),
                                           inputs[i].const_data_ptr(), outs, b, stream));
  }
  return ipc_work(c10d::OpType::ALLGATHER_INTO_TENSOR_COALESCED, "all_gather_into_tensor_coalesced", outputs, stream, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                           std::vector<std::vector<at::Tensor>>& inputs,
                                                           const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(inputs.size() == 1 && outputs.size() == 1, "fastpar.reduce_scatter: expected one output tensor "
                    "and one input list (one per process), got ", outputs.size(), " and ", inputs.size());
  at::Tensor& out = outputs[0];
  check_cuda("reduce_scatter", "output", out);
  TORCH_CHECK_VALUE(int64_t(inputs[0].size()) == getSize(), "fastpar.reduce_scatter: input_list has ",
                    inputs[0].size(), " tensors but the group has ", getSize(), " ranks");
  bool contiguous = out.is_contiguous(), same_device = true;
  for (size_t q = 0; q < inputs[0].size(); ++q) {
    const at::Tensor& x = inputs[0][q];
    check_like("reduce_scatter", "input_list[" + std::to_string(q) + "]", x, out, "output", out.numel());
    contiguous = contiguous && x.is_contiguous();
    same_device = same_device && x.device() == out.device();
  }
  std::unique_lock<std::mutex> g(mu_);
  cuda_ipc::RouteQuery q = query_for("reduce_scatter", out);
  const std::optional<DType> dt = maybe_dtype(out.scalar_type());
  q.dtype_supported = dt.has_value();
  q.op_supported = reduces(dt, opts.reduceOp);
  q.contiguous = contiguous;
  q.on_rank_device = q.on_rank_device && same_device;
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("reduce_scatter", q);
    g.unlock();
    return fallback_->reduce_scatter(outputs, inputs, opts);
  }
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  c10::cuda::CUDAGuard guard(out.device());
  const c10::cuda::CUDAStream stream = begin_ipc("reduce_scatter", out, timeout);
  const void* ins[cuda_ipc::kMaxIpcRanks];
  for (int r = 0; r < getSize(); ++r) ins[r] = inputs[0][size_t(r)].const_data_ptr();
  C10_CUDA_CHECK(cuda_ipc::reduce_scatter_ipc(link_->ep->comm(), *dt, ReduceOp(int(opts.reduceOp.op_)), ins,
                                              out.data_ptr(), out.numel(), stream));
  return ipc_work(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", outputs, stream, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                 const c10d::ReduceScatterOptions& opts) {
  check_cuda("reduce_scatter_tensor", "output", output);
  check_like("reduce_scatter_tensor", "input", input, output, "output", output.numel() * getSize());
  std::unique_lock<std::mutex> g(mu_);
  cuda_ipc::RouteQuery q = query_for("reduce_scatter_tensor", output);
  const std::optional<DType> dt = maybe_dtype(output.scalar_type());
  q.dtype_supported = dt.has_value();
  q.op_supported = reduces(dt, opts.reduceOp);
  q.contiguous = input.is_contiguous() && output.is_contiguous();
  q.on_rank_device = q.on_rank_device && input.device() == output.device();
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("reduce_scatter_tensor", q);
    g.unlock();
    return fallback_->_reduce_scatter_base(output, input, opts);
  }
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  c10::cuda::CUDAGuard guard(output.device());
  const c10::cuda::CUDAStream stream = begin_ipc("reduce_scatter_tensor", output, timeout);
  const void* ins[cuda_ipc::kMaxIpcRanks];
  for (int r = 0; r < getSize(); ++r)
    ins[r] = static_cast<const char*>(input.const_data_ptr()) + int64_t(output.nbytes()) * r;
  C10_CUDA_CHECK(cuda_ipc::reduce_scatter_ipc(link_->ep->comm(), *dt, ReduceOp(int(opts.reduceOp.op_)), ins,
                                              output.data_ptr(), output.numel(), stream));
  return ipc_work(c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", {output}, stream, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                            std::vector<at::Tensor>& inputs,
                                                                            const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "fastpar.reduce_scatter_tensor_coalesced: ", outputs.size(),
                    " outputs but ", inputs.size(), " inputs");
  if (inputs.empty()) return fallback_->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
  for (size_t i = 0; i < outputs.size(); ++i) {
    check_cuda("reduce_scatter_tensor_coalesced", ("outputs[" + std::to_string(i) + "]").c_str(), outputs[i]);
    check_like("reduce_scatter_tensor_coalesced", "inputs[" + std::to_string(i) + "]", inputs[i], outputs[i],
               ("outputs[" + std::to_string(i) + "]").c_str(), outputs[i].numel() * getSize());
  }
  std::unique_lock<std::mutex> g(mu_);
  cuda_ipc::RouteQuery q = query_for("reduce_scatter_tensor_coalesced", outputs[0]);
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::optional<DType> dt = maybe_dtype(outputs[i].scalar_type());
    q.dtype_supported = q.dtype_supported && dt.has_value();
    q.op_supported = q.op_supported && reduces(dt, opts.reduceOp);
    q.nbytes = std::max<int64_t>(q.nbytes, int64_t(outputs[i].nbytes()));
    q.contiguous = q.contiguous && inputs[i].is_contiguous() && outputs[i].is_contiguous();
    q.on_rank_device = q.on_rank_device && inputs[i].get_device() == device_ && outputs[i].get_device() == device_;
  }
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("reduce_scatter_tensor_coalesced", q);
    g.unlock();
    return fallback_->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
  }
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  c10::cuda::CUDAGuard guard(outputs[0].device());
  const c10::cuda::CUDAStream stream = begin_ipc("reduce_scatter_tensor_coalesced", outputs[0], timeout);
  for (size_t i = 0; i < outputs.size(); ++i) {
    const void* ins[cuda_ipc::kMaxIpcRanks];
    for (int r = 0; r < getSize(); ++r)
      ins[r] = static_cast<const char*>(inputs[i].const_data_ptr()) + int64_t(outputs[i].nbytes()) * r;
    C10_CUDA_CHECK(cuda_ipc::reduce_scatter_ipc(link_->ep->comm(), *maybe_dtype(outputs[i].scalar_type()),
                                                ReduceOp(int(opts.reduceOp.op_)), ins, outputs[i].data_ptr(),
                                                outputs[i].numel(), stream));
  }
  return ipc_work(c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, "reduce_scatter_tensor_coalesced", outputs, stream, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                const c10d::AllreduceCoalescedOptions& opts) {
  if (tensors.empty()) return fallback_->allreduce_coalesced(tensors, opts);
  for (size_t i = 0; i < tensors.size(); ++i)
    check_cuda("all_reduce_coalesced", ("tensors[" + std::to_string(i) + "]").c_str(), tensors[i]);
  std::unique_lock<std::mutex> g(mu_);
  cuda_ipc::RouteQuery q = query_for("all_reduce_coalesced", tensors[0]);
  for (const at::Tensor& t : tensors) {
    const std::optional<DType> dt = maybe_dtype(t.scalar_type());
    q.dtype_supported = q.dtype_supported && dt.has_value();
    q.op_supported = q.op_supported && reduces(dt, opts.reduceOp);
    q.nbytes = std::max<int64_t>(q.nbytes, int64_t(t.nbytes()));
    q.contiguous = q.contiguous && t.is_contiguous();
    q.on_rank_device = q.on_rank_device && t.get_device() == device_;
  }
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("all_reduce_coalesced", q);
    g.unlock();
    return fallback_->allreduce_coalesced(tensors, opts);
  }
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  c10::cuda::CUDAGuard guard(tensors[0].device());
  const c10::cuda::CUDAStream stream = begin_ipc("all_reduce_coalesced", tensors[0], timeout);
  cuda_ipc::IpcComm& c = link_->ep->comm();
  const ReduceOp rop = ReduceOp(int(opts.reduceOp.op_));
  for (at::Tensor& t : tensors) {
    if (t.numel() == 0 || getSize() == 1) continue;  // as all_reduce: every rank skips the same entries
    const DType dt = *maybe_dtype(t.scalar_type());
    if (cuda_ipc::prefer_one_shot(int64_t(t.nbytes()), c)) {
      C10_CUDA_CHECK(cuda_ipc::allreduce_one_shot(c, dt, rop, t.const_data_ptr(), t.data_ptr(), t.numel(), stream));
    } else {
      C10_CUDA_CHECK(cuda_ipc::allreduce_two_shot(c, dt, rop, t.const_data_ptr(), t.data_ptr(), t.numel(), stream));
    }
  }
  return ipc_work(c10d::OpType::ALLREDUCE_COALESCED, "all_reduce_coalesced", tensors, stream, timeout);
}

// ---------------------------------------------------------------- fallback only

// NCCL serves these; a group whose ranks share a GPU has no NCCL, so they are
// refused there by name instead of failing inside NCCL's setup. Known only
// once IPC was set up (by an earlier IPC-capable call).
#define FASTPAR_NOT_ON_SHARED_GPU(op)                                                                         \
  TORCH_CHECK_VALUE(!shares_gpu(), "fastpar.", op, ": ranks of this group share a GPU, where NCCL cannot run " \
                    "(it refuses two ranks on one device), and this collective has no CUDA IPC schedule yet; "  \
                    "use CPU tensors for it (fastpar's shared-memory path) or one GPU per rank")

c10::intrusive_ptr<c10d::Work> CudaBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                std::vector<at::Tensor>& inputs,
                                                                const c10d::AllgatherOptions& opts) {
  FASTPAR_NOT_ON_SHARED_GPU("all_gather_coalesced");
  return fallback_->allgather_coalesced(outputs, inputs, opts);
}

// ---------------------------------------------------------------- root-list and all-to-all collectives
//
// Only some ranks hold some of these tensors (gather's outputs on the root,
// scatter's inputs on the root), so the route is decided from what every
// rank holds (its own input / output); list entries that are not contiguous
// go through contiguous temporaries copied on the same stream (StagedOutputs,
// .contiguous()).

c10::intrusive_ptr<c10d::Work> CudaBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                   std::vector<at::Tensor>& inputs,
                                                   const c10d::GatherOptions& opts) {
  TORCH_CHECK_VALUE(inputs.size() == 1, "fastpar.gather: expected exactly one input tensor (one per process), got ",
                    inputs.size());
  const at::Tensor& in = inputs[0];
  check_cuda("gather", "tensor", in);
  check_root("gather", opts.rootRank, getSize());
  const bool root = getRank() == opts.rootRank;
  if (root) {
    TORCH_CHECK_VALUE(outputs.size() == 1 && int64_t(outputs[0].size()) == getSize(), "fastpar.gather: gather_list "
                      "on the root must hold ", getSize(), " tensors (one per rank), got ",
                      outputs.empty() ? 0 : outputs[0].size());
    for (size_t q = 0; q < outputs[0].size(); ++q) {
      const at::Tensor& o = outputs[0][q];
      check_like("gather", "gather_list[" + std::to_string(q) + "]", o, in, "tensor", in.numel());
      TORCH_CHECK_VALUE(o.device() == in.device(), "fastpar.gather: gather_list[", q, "] is on '", o.device().str(),
                        "' but tensor is on '", in.device().str(), "'");
    }
  } else {
    TORCH_CHECK_VALUE(outputs.empty() || outputs[0].empty(), "fastpar.gather: gather_list must be empty on "
                      "non-root ranks, got ", outputs[0].size(), " tensors on rank ", getRank());
  }
  std::unique_lock<std::mutex> g(mu_);
  const cuda_ipc::RouteQuery q = query_for("gather", in);
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("gather", q);
    g.unlock();
    return fallback_->gather(outputs, inputs, opts);
  }
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  c10::cuda::CUDAGuard guard(in.device());
  const c10::cuda::CUDAStream stream = begin_ipc("gather", in, timeout);
  StagedOutputs staged;
  void* outs[cuda_ipc::kMaxIpcRanks] = {};
  if (root)
    for (int r = 0; r < getSize(); ++r) outs[r] = staged.add(outputs[0][size_t(r)]);
  C10_CUDA_CHECK(cuda_ipc::gather_ipc(link_->ep->comm(), int32_t(in.scalar_type()), in.numel(), in.const_data_ptr(),
                                      outs, int64_t(in.nbytes()), int(opts.rootRank), stream));
  staged.finish();
  return ipc_work(c10d::OpType::GATHER, "gather", root ? outputs[0] : std::vector<at::Tensor>{}, stream, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::scatter(std::vector<at::Tensor>& outputs,
                                                    std::vector<std::vector<at::Tensor>>& inputs,
                                                    const c10d::ScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == 1, "fastpar.scatter: expected exactly one output tensor (one per process), got ",
                    outputs.size());
  at::Tensor& out = outputs[0];
  check_cuda("scatter", "tensor", out);
  check_root("scatter", opts.rootRank, getSize());
  const bool root = getRank() == opts.rootRank;
  std::vector<at::Tensor> ins;
  if (root) {
    TORCH_CHECK_VALUE(inputs.size() == 1 && int64_t(inputs[0].size()) == getSize(), "fastpar.scatter: scatter_list "
                      "on the root must hold ", getSize(), " tensors (one per rank), got ",
                      inputs.empty() ? 0 : inputs[0].size());
    for (size_t q = 0; q < inputs[0].size(); ++q) {
      const at::Tensor& x = inputs[0][q];
      check_like("scatter", "scatter_list[" + std::to_string(q) + "]", x, out, "tensor", out.numel());
      TORCH_CHECK_VALUE(x.device() == out.device(), "fastpar.scatter: scatter_list[", q, "] is on '",
                        x.device().str(), "' but tensor is on '", out.device().str(), "'");
    }
  } else {
    TORCH_CHECK_VALUE(inputs.empty() || inputs[0].empty(), "fastpar.scatter: scatter_list must be empty on "
                      "non-root ranks, got ", inputs[0].size(), " tensors on rank ", getRank());
  }
  std::unique_lock<std::mutex> g(mu_);
  const cuda_ipc::RouteQuery q = query_for("scatter", out);
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("scatter", q);
    g.unlock();
    return fallback_->scatter(outputs, inputs, opts);
  }
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  c10::cuda::CUDAGuard guard(out.device());
  const c10::cuda::CUDAStream stream = begin_ipc("scatter", out, timeout);
  const void* srcs[cuda_ipc::kMaxIpcRanks] = {};
  if (root) {
    for (int r = 0; r < getSize(); ++r) {
      ins.push_back(inputs[0][size_t(r)].contiguous());  // a copy on the current stream when strided
      srcs[r] = ins.back().const_data_ptr();
    }
  }
  C10_CUDA_CHECK(cuda_ipc::scatter_ipc(link_->ep->comm(), int32_t(out.scalar_type()), out.numel(), srcs,
                                       out.data_ptr(), int64_t(out.nbytes()), int(opts.rootRank), stream));
  return ipc_work(c10d::OpType::SCATTER, "scatter", outputs, stream, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                          std::vector<int64_t>& output_split_sizes,
                                                          std::vector<int64_t>& input_split_sizes,
                                                          const c10d::AllToAllOptions& opts) {
  check_cuda("all_to_all_single", "input", input);
  check_like("all_to_all_single", "output", output, input, "input", output.numel());
  const int n = getSize();
  std::unique_lock<std::mutex> g(mu_);
  cuda_ipc::RouteQuery q = query_for("all_to_all_single", input);
  q.contiguous = input.is_contiguous() && output.is_contiguous();
  q.on_rank_device = q.on_rank_device && output.device() == input.device();
  if (!input_split_sizes.empty() || !output_split_sizes.empty()) {
    // Split sizes given: the per-pair rings (see all_to_all_pairs). The
    // sizes, and whether they happen to be equal, differ by rank, so the
    // route is picked by the call's form, which every rank shares, and not
    // by the threshold (FASTPAR_CUDA_IPC_MAX_BYTES=0 still turns IPC off).
    q.nbytes = 0;
    if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
      to_fallback("all_to_all_single", q);
      g.unlock();
      return fallback_->alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
    }
    const int64_t in_rows = input.dim() == 0 ? 1 : input.size(0), out_rows = output.dim() == 0 ? 1 : output.size(0);
    auto row_bytes = [](const at::Tensor& t, int64_t rows) { return rows == 0 ? 0 : int64_t(t.nbytes()) / rows; };
    const std::vector<int64_t> in_b = all_to_all_split("input", input_split_sizes, in_rows, row_bytes(input, in_rows), n);
    const std::vector<int64_t> out_b =
        all_to_all_split("output", output_split_sizes, out_rows, row_bytes(output, out_rows), n);
    std::vector<const void*> ins(static_cast<size_t>(n));
    std::vector<void*> outs(static_cast<size_t>(n));
    int64_t io = 0, oo = 0;
    for (int r = 0; r < n; ++r) {
      ins[size_t(r)] = static_cast<const char*>(input.const_data_ptr()) + io;
      outs[size_t(r)] = static_cast<char*>(output.data_ptr()) + oo;
      io += in_b[size_t(r)];
      oo += out_b[size_t(r)];
    }
    return all_to_all_pairs("all_to_all_single", c10d::OpType::ALLTOALL_BASE, ins, in_b, outs, out_b,
                            {input, output}, {output}, call_timeout(opts.timeout, timeout_), nullptr);  // no staging
  }
  // No split sizes: n equal blocks, the same on every rank (the collective's
  // rules), so the phase-protocol schedule and the size threshold apply.
  all_to_all_split("input", {}, input.dim() == 0 ? 1 : input.size(0), 1, n);
  all_to_all_split("output", {}, output.dim() == 0 ? 1 : output.size(0), 1, n);
  TORCH_CHECK_VALUE(output.numel() == input.numel(), "fastpar.all_to_all_single: without split sizes, output must "
                    "have as many elements as input (", input.numel(), "), got ", output.numel());
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("all_to_all_single", q);
    g.unlock();
    return fallback_->alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
  }
  const std::chrono::milliseconds timeout = call_timeout(opts.timeout, timeout_);
  c10::cuda::CUDAGuard guard(input.device());
  const c10::cuda::CUDAStream stream = begin_ipc("all_to_all_single", input, timeout);
  const int64_t block = int64_t(input.nbytes()) / n;
  const void* srcs[cuda_ipc::kMaxIpcRanks];
  void* dsts[cuda_ipc::kMaxIpcRanks];
  for (int r = 0; r < n; ++r) {
    srcs[r] = static_cast<const char*>(input.const_data_ptr()) + block * r;
    dsts[r] = static_cast<char*>(output.data_ptr()) + block * r;
  }
  C10_CUDA_CHECK(cuda_ipc::all_to_all_ipc(link_->ep->comm(), int32_t(input.scalar_type()), input.numel() / n, srcs,
                                          dsts, block, stream));
  return ipc_work(c10d::OpType::ALLTOALL_BASE, "all_to_all_single", {output}, stream, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllToAllOptions& opts) {
  const int n = getSize();
  TORCH_CHECK_VALUE(int(inputs.size()) == n && int(outputs.size()) == n, "fastpar.all_to_all: input_tensor_list and "
                    "output_tensor_list must hold ", n, " tensors (one per rank), got ", inputs.size(), " and ",
                    outputs.size());
  check_cuda("all_to_all", "input_tensor_list[0]", inputs[0]);
  for (int r = 0; r < n; ++r) {
    check_cuda("all_to_all", ("input_tensor_list[" + std::to_string(r) + "]").c_str(), inputs[size_t(r)]);
    check_cuda("all_to_all", ("output_tensor_list[" + std::to_string(r) + "]").c_str(), outputs[size_t(r)]);
    TORCH_CHECK_VALUE(inputs[size_t(r)].scalar_type() == inputs[0].scalar_type() &&
                      outputs[size_t(r)].scalar_type() == inputs[0].scalar_type(),
                      "fastpar.all_to_all: every tensor must have dtype ", inputs[0].scalar_type(),
                      " (input_tensor_list[0]'s); entry ", r, " has ", inputs[size_t(r)].scalar_type(), " / ",
                      outputs[size_t(r)].scalar_type());
  }
  std::unique_lock<std::mutex> g(mu_);
  cuda_ipc::RouteQuery q = query_for("all_to_all", inputs[0]);
  // The per-pair rings, whatever the sizes: they (and whether they happen to
  // be equal) differ by rank, so the route ignores them and the threshold
  // (see alltoall_base). Inputs are made contiguous and outputs staged, so
  // layouts do not matter either.
  q.nbytes = 0;
  q.contiguous = true;
  if (cuda_ipc::route_ipc(q) == cuda_ipc::Route::kFallback) {
    to_fallback("all_to_all", q);
    g.unlock();
    return fallback_->alltoall(outputs, inputs, opts);
  }
  for (int r = 0; r < n; ++r)
    TORCH_CHECK_VALUE(inputs[size_t(r)].device() == inputs[0].device() &&
                      outputs[size_t(r)].device() == inputs[0].device(),
                      "fastpar.all_to_all: every tensor must be on ", inputs[0].device(), " (input_tensor_list[0]'s); "
                      "entry ", r, " is on ", inputs[size_t(r)].device(), " / ", outputs[size_t(r)].device());
  std::vector<at::Tensor> keep;
  auto staged = std::make_shared<StagedOutputs>();  // outlives this call in the lambda below
  std::vector<const void*> ins(static_cast<size_t>(n));
  std::vector<void*> outs(static_cast<size_t>(n));
  std::vector<int64_t> in_b(static_cast<size_t>(n)), out_b(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    keep.push_back(inputs[size_t(r)].contiguous());
    ins[size_t(r)] = keep.back().const_data_ptr();
    in_b[size_t(r)] = int64_t(keep.back().nbytes());
    outs[size_t(r)] = staged->add(outputs[size_t(r)]);
    out_b[size_t(r)] = int64_t(outputs[size_t(r)].nbytes());
  }
  for (const at::Tensor& t : outputs) keep.push_back(t);
  for (const at::Tensor& t : staged->staged) keep.push_back(t);  // written on the receive streams
  return all_to_all_pairs("all_to_all", c10d::OpType::ALLTOALL, ins, in_b, outs, out_b, keep, outputs,
                          call_timeout(opts.timeout, timeout_), [staged] { staged->finish(); });
}

c10::intrusive_ptr<c10d::Work> CudaBackend::all_to_all_pairs(const char* op, c10d::OpType type,
                                                             const std::vector<const void*>& ins,
                                                             const std::vector<int64_t>& in_bytes,
                                                             const std::vector<void*>& outs,
                                                             const std::vector<int64_t>& out_bytes,
                                                             const std::vector<at::Tensor>& keep,
                                                             std::vector<at::Tensor> outputs,
                                                             std::chrono::milliseconds timeout,
                                                             const std::function<void()>& after) {
  const int n = getSize(), r = getRank();
  TORCH_CHECK_VALUE(in_bytes[size_t(r)] == out_bytes[size_t(r)], "fastpar.", op, ": this rank sends itself ",
                    in_bytes[size_t(r)], " bytes but expects ", out_bytes[size_t(r)], " from itself");
  const at::Tensor& like = keep[0];
  c10::cuda::CUDAGuard guard(like.device());
  const c10::cuda::CUDAStream current = begin_ipc(op, like, timeout);
  cuda_ipc::IpcComm& c = link_->ep->comm();
  c10::cuda::CUDAEvent ready;
  ready.record(current);
  std::vector<c10::cuda::CUDAStream> used;
  for (int q = 0; q < n; ++q) {
    if (q == r) continue;
    for (bool is_send : {true, false}) {
      const c10::cuda::CUDAStream side = p2p_stream(q, is_send);
      ready.block(side);
      for (const at::Tensor& t : keep) t.record_stream(side.unwrap());
      if (is_send) {
        C10_CUDA_CHECK(cuda_ipc::send_ipc(c, ins[size_t(q)], in_bytes[size_t(q)], q, kAllToAllTag, side));
      } else {
        C10_CUDA_CHECK(cuda_ipc::recv_ipc(c, outs[size_t(q)], out_bytes[size_t(q)], q, kAllToAllTag, side));
      }
      used.push_back(side);
    }
  }
  if (in_bytes[size_t(r)] > 0)
    C10_CUDA_CHECK(cudaMemcpyAsync(outs[size_t(r)], ins[size_t(r)], size_t(in_bytes[size_t(r)]),
                                   cudaMemcpyDeviceToDevice, current));
  // The call completes on the caller's stream, like every other collective.
  for (const c10::cuda::CUDAStream& side : used) {
    c10::cuda::CUDAEvent done;
    done.record(side);
    done.block(current);
  }
  if (after) after();
  return ipc_work(type, op, std::move(outputs), current, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  return point_to_point("send", tensors, dst_rank, tag, /*is_send=*/true);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  return point_to_point("recv", tensors, src_rank, tag, /*is_send=*/false);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  // The IPC rings match in order per pair (p2p_ring.h): learning which peer's
  // message came first would need a device-to-host read before the copy is
  // enqueued. NCCL has no any-source receive either.
  TORCH_CHECK_VALUE(!shares_gpu(), "fastpar.recv: a receive from any source (src=None) of a CUDA tensor is not "
                    "supported: CUDA IPC matches messages per sender and NCCL has no any-source receive; name "
                    "the source rank");
  return fallback_->recvAnysource(tensors, tag);
}

c10::cuda::CUDAStream CudaBackend::p2p_stream(int peer, bool is_send) {
  std::vector<std::optional<c10::cuda::CUDAStream>>& v = is_send ? send_streams_ : recv_streams_;
  if (v.empty()) v.resize(size_t(getSize()));
  if (!v[size_t(peer)]) v[size_t(peer)] = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device_);
  return *v[size_t(peer)];
}

c10::intrusive_ptr<c10d::Work> CudaBackend::point_to_point(const char* op, std::vector<at::Tensor>& tensors,
                                                           int peer, int tag, bool is_send) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "fastpar.", op, ": expected exactly one tensor, got ", tensors.size());
  at::Tensor& t = tensors[0];
  check_cuda(op, "tensors[0]", t);
  TORCH_CHECK_VALUE(peer >= 0 && peer < getSize() && peer != getRank(), "fastpar.", op, ": ",
                    is_send ? "dst" : "src", " is ", peer, " but must be another rank of the group (0..",
                    getSize() - 1, ", not this rank ", getRank(), ")");
  std::unique_lock<std::mutex> g(mu_);
  // Setup is collective (every rank meets in the Store), a send is not: only
  // a group set up by its first CUDA collective, or at creation
  // (init_process_group(device_id=...): connect()), can use IPC for it.
  // Before that, NCCL, which cannot run where ranks share a GPU.
  bool ipc = set_up_;
  cuda_ipc::RouteQuery q;
  if (ipc) {
    q = query_for(op, t);
    ipc = cuda_ipc::route_ipc(q) == cuda_ipc::Route::kIpc;
    if (!ipc) to_fallback(op, q);
  } else {
    ++fallback_calls_;
  }
  if (!ipc) {
    g.unlock();
    return is_send ? fallback_->send(tensors, peer, tag) : fallback_->recv(tensors, peer, tag);
  }
  const std::chrono::milliseconds timeout = timeout_;
  c10::cuda::CUDAGuard guard(t.device());
  const c10::cuda::CUDAStream current = begin_ipc(op, t, timeout);
  // One stream per peer and direction: messages to one peer run in the order
  // they were posted (the ring's chunk numbers are counted here, at enqueue),
  // and a large send waiting for its receiver to drain the ring never holds
  // up this rank's receives or its traffic with other peers.
  const c10::cuda::CUDAStream side = p2p_stream(peer, is_send);
  c10::cuda::CUDAEvent ready;
  ready.record(current);
  ready.block(side);
  // The caching allocator must not reuse the tensor's memory before the side
  // stream is done with it.
  t.record_stream(side.unwrap());
  cuda_ipc::IpcComm& c = link_->ep->comm();
  if (is_send) {
    C10_CUDA_CHECK(cuda_ipc::send_ipc(c, t.data_ptr(), int64_t(t.nbytes()), peer, tag, side));
  } else {
    C10_CUDA_CHECK(cuda_ipc::recv_ipc(c, t.data_ptr(), int64_t(t.nbytes()), peer, tag, side));
  }
  return ipc_work(is_send ? c10d::OpType::SEND : c10d::OpType::RECV, op, tensors, side, timeout);
}

c10::intrusive_ptr<c10d::Work> CudaBackend::barrier(const c10d::BarrierOptions& opts) {
  FASTPAR_NOT_ON_SHARED_GPU("barrier");
  return fallback_->barrier(opts);
}

#undef FASTPAR_NOT_ON_SHARED_GPU

void register_cuda_backend(pybind11::module& m) {
  namespace py = pybind11;
  py::module::import("torch._C._distributed_c10d");  // registers c10d::Backend with pybind first
  py::class_<CudaBackend, c10d::Backend, c10::intrusive_ptr<CudaBackend>>(m, "CudaBackend", R"(
fastpar's backend for CUDA tensors of ranks on one host: every collective and
send/recv over CUDA IPC where the route allows (docs/cuda.md), the rest through
`fallback` (NCCL). Created by fastpar.distributed and held by the group's
ShmBackend, which forwards CUDA tensors to it.)")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, int64_t timeout_ms,
                       const c10::intrusive_ptr<c10d::Backend>& fallback) {
             return c10::make_intrusive<CudaBackend>(store, rank, size, std::chrono::milliseconds(timeout_ms),
                                                     fallback);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_ms"), py::arg("fallback"),
           py::call_guard<py::gil_scoped_release>())
      .def("_connect", &CudaBackend::connect, py::arg("device"), "Sets CUDA IPC up now on cuda:`device` "
           "(collective; otherwise done at the group's first CUDA collective).",
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("ipc_state", &CudaBackend::ipc_state)
      .def("abort", &CudaBackend::abort, "Stops this rank's CUDA IPC kernels now and aborts the fallback; never "
           "blocks. The group is unusable afterwards.", py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("shares_gpu", &CudaBackend::shares_gpu)
      .def_property_readonly("mps", &CudaBackend::mps)
      .def_property_readonly("dead_peer", &CudaBackend::dead_peer)
      .def_property_readonly("ipc_calls", &CudaBackend::ipc_calls)
      .def_property_readonly("fallback_calls", &CudaBackend::fallback_calls)
      .def_property_readonly("max_ipc_bytes", &CudaBackend::max_ipc_bytes)
      .def_property_readonly("blocking_wait", &CudaBackend::blocking_wait)
      .def_property_readonly("fallback", &CudaBackend::fallback);
}

}  // namespace ops
}  // namespace fastpar
