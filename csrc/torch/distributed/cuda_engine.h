// The engine for CUDA tensors of one host (engine.h; compiled in CUDA builds
// only).
//
// all_reduce, broadcast, reduce, all_gather (+ all_gather_into_tensor and the
// coalesced forms), reduce_scatter (+ reduce_scatter_tensor and its coalesced
// form), gather, scatter, all_to_all (every form) and send/recv run over CUDA
// IPC (core/executors/cuda_ipc: kernels on the caller's current stream;
// send/recv and all_to_all with split sizes on a stream per peer and direction
// ordered after it) when route.h says so; any-source receives, send/recv
// before the group's first CUDA collective and calls the route refuses go to
// `fallback`, a ProcessGroupNCCL the Python creator builds on the group's
// store (fastpar/distributed/backend.py). Ranks on several hosts: a
// HierarchicalEngine composes one of these per host with NCCL between hosts.
//
// Ranks may share a GPU (several processes on one device): IPC works there,
// NCCL does not ("Duplicate GPU detected"), so such a group ignores the size
// threshold and refuses, with a message, the calls IPC cannot serve instead
// of handing them to NCCL. Without MPS the GPU time-slices between the
// processes: a warning once, and ipc_state says so.
//
// Faults: the peers' pids travel at setup, a PeerWatcher thread reads
// /proc and, when a peer dies, raises the host abort word that the waiting
// phase kernels poll; the Work's wait() and the next call raise
// DistBackendError naming the op and the dead rank (cuda_ipc_work.h).
//
// Setup is lazy, at the first CUDA collective that IPC serves, or at group
// creation through connect() (both collective, so every rank sets up
// together, as NCCL creates its communicators): the tensor's device becomes
// this rank's IPC device, then cuda_ipc_rendezvous.h probes peer access and
// exchanges arena handles through the Store. IPC is on for every rank or for
// none.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <c10/cuda/CUDAStream.h>

#include <atomic>
#include <climits>
#include <chrono>
#include <memory>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>
#include <string>

#include "../../core/executors/cuda_ipc/ipc_allreduce.h"  // default_one_shot_max_bytes
#include "../../core/transport/cuda_ipc/ipc_endpoint.h"
#include "../../core/transport/cuda_ipc/ipc_failure.h"
#include "route.h"
#include "../../core/transport/registered_arena.h"
#include "../../core/transport/collective_call.h"  // kForeignDType
#include "../dtypes.h"  // maybe_dtype
#include "cuda_event_pool.h"
#include "c10d_engine.h"
#include "cuda_ipc_work.h"
#include "engine.h"
#include "knobs.h"

namespace fastpar {
namespace distributed {

class CudaEngine : public Engine {
 public:
  // Over the ranks of one host (on several hosts, a HierarchicalEngine holds
  // one per host); `fallback` is NCCL over the same ranks.
  CudaEngine(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::chrono::milliseconds timeout,
             c10::intrusive_ptr<c10d::Backend> fallback, const CudaKnobs& knobs);
  ~CudaEngine() override;

  void set_timeout(std::chrono::milliseconds timeout) override;
  void shutdown() override;
  void abort() override;

  // Over IPC where the route says so, else the fallback. The reductions and
  // the copies (cuda_engine_collectives.cpp):
  Work all_reduce(at::Tensor& t, const Call& c) override;
  // all_reduce() without a Work or an event.
  void all_reduce_now(at::Tensor& t, const Call& c) override;
  Work all_reduce_coalesced(std::vector<at::Tensor>& ts, const Call& c) override;
  Work reduce(at::Tensor& t, const Call& c) override;
  Work reduce_scatter(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins, const Call& c) override;
  Work broadcast(at::Tensor& t, const Call& c) override;
  Work all_gather(std::vector<at::Tensor>& outs, at::Tensor& in, const Call& c) override;
  Work all_gather_into(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins, const Call& c) override;
  Work gather(std::vector<at::Tensor>& outs, at::Tensor& in, const Call& c) override;
  Work scatter(at::Tensor& out, std::vector<at::Tensor>& ins, const Call& c) override;
  Work barrier(const Call& c) override;
  // Pairs of ranks (cuda_engine_p2p.cpp):
  Work all_to_all(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits, std::vector<int64_t>& in_splits,
                  const Call& c) override;
  Work send(at::Tensor& t, int peer, int tag) override;
  Work recv(at::Tensor& t, int peer, int tag) override;

  // Sets IPC up now on `device`, if not yet: a collective call, like the
  // lazy setup at the first collective. fastpar.distributed calls it when
  // init_process_group(device_id=...) bound the group to a GPU, so that
  // send/recv before any collective runs over IPC too.
  void connect(int device);

  // An uninitialized CUDA tensor on cuda:`device` inside this rank's IPC
  // arena (FASTPAR_CUDA_IPC_REGISTERED_BYTES of it): all_reduce on it, whole
  // and past the one-shot sizes, reads it where the peers wrote it, without
  // the copy-in (allreduce_registered). Collective: every rank calls it with
  // the same sizes in the same order (one phase checks the offsets agree; it
  // waits for the peers). Sets IPC up if the group has not yet.
  at::Tensor registered_empty(const std::vector<int64_t>& sizes, at::ScalarType dtype, int device) override;
  bool is_registered(const at::Tensor& t) const override;
  int64_t registered_bytes() const { return registered_->bytes(); }

  // Diagnostics (Python properties): "not set up", "ipc on cuda:N" (plus
  // "; <GPU-sharing note>" when ranks share a GPU), or "fallback: <reason>";
  // how many CUDA calls took each route.
  std::string ipc_state() const;
  bool shares_gpu() const;
  // "on", "off", "unknown" (cudaDevAttrMpsEnabled), or "" before setup.
  std::string mps() const;
  // The rank the peer watcher found dead, or -1.
  int dead_peer() const;
  int64_t ipc_calls() const { return ipc_calls_; }
  // Of those, the all_reduce calls made without a Work (allreduce_direct).
  int64_t direct_calls() const { return direct_calls_; }
  int64_t fallback_calls() const { return fallback_calls_; }
  int64_t max_ipc_bytes() const { return max_ipc_bytes_; }
  // all_reduce runs one-shot up to this many bytes:
  // FASTPAR_CUDA_IPC_ONE_SHOT_MAX_BYTES, else
  // cuda_ipc::default_one_shot_max_bytes (a size table by rank count).
  int64_t one_shot_max_bytes() const {
    const int64_t set = one_shot_max_bytes_;
    return set >= 0 ? set : cuda_ipc::default_one_shot_max_bytes(size());
  }
  bool blocking_wait() const { return blocking_wait_; }
  // FASTPAR_CUDA_IPC_TWO_SHOT: "fused" or "steps" (the default).
  const char* ipc_two_shot() const;
  // FASTPAR_CUDA_IPC_COLLECTIVES (broadcast, gather, scatter, all_to_all,
  // reduce, reduce_scatter): "fused" or "steps" (the default).
  const char* ipc_collectives() const;
  // The one-kernel calls' block barriers: "peer" (the default: each waiter
  // polls the peer's flag) or "waiter" (each rank writes its arrival into
  // the waiter's memory, cuda_ipc::FlagForm), the measured alternative
  // only the test hook selects.
  const char* ipc_flags() const;
  // The test hook (fastpar._C._testing.cuda_override): `knob` one of
  // FASTPAR_CUDA_IPC_TWO_SHOT, _COLLECTIVES and _ONE_SHOT_MAX_BYTES, `value`
  // as the environment spells it ("" for the default), or FASTPAR_CUDA_IPC_FLAGS
  // ("peer" or "waiter": ipc_flags; no environment variable), in force from
  // the next call. Every rank must call it between the same calls (a mix fails with a
  // descriptor mismatch).
  void testing_override(const std::string& knob, const std::string& value);
  // The NCCL group the fallback runs on.
  c10::intrusive_ptr<c10d::Backend> fallback() const { return fallback_->inner(); }

 private:
  void set_up(int device);  // the lazy, collective IPC setup (mu_ held)
  void release_ipc(bool farewell) noexcept;
  // The shape of every IPC collective (cuda_engine_collectives.cpp): route,
  // then launch on the caller's stream or hand the call to the fallback.
  template <class Adjust, class Launch, class Fallback>
  Work run(const char* op, c10d::OpType type, const at::Tensor& t,
                                     std::chrono::milliseconds given_timeout, std::vector<at::Tensor> outputs,
                                     Adjust&& adjust, Launch&& launch, Fallback&& fallback, bool capturable = false);
  template <class Adjust, class Launch>
  std::optional<c10::cuda::CUDAStream> try_ipc(const char* op, const at::Tensor& t,
                                               std::chrono::milliseconds timeout, std::unique_lock<std::mutex>& g,
                                               Adjust&& adjust, Launch&& launch, bool capturable);
  void launch_allreduce(cuda_ipc::IpcComm& c, const c10::cuda::CUDAStream& stream, const cuda_ipc::RouteQuery& q,
                        at::Tensor& t, ReduceOp rop);
  // Sets IPC up at the first eligible-looking CUDA call (mu_ held) and checks
  // the tensor is on the IPC device; the query's setup-dependent fields.
  cuda_ipc::RouteQuery query_for(const char* op, const at::Tensor& t);
  // For the calls only NCCL serves: refuses them by name where ranks share a
  // GPU (no NCCL there) instead of failing inside NCCL's setup. Known once IPC
  // is set up (by an earlier IPC-capable call, or connect()).
  void refuse_on_shared_gpu(const char* op) const;
  // Whether the route (route.h) sends the call to the fallback. If so: refuses
  // it (ValueError naming `op` and why IPC would not serve it) when ranks share
  // a GPU, where NCCL cannot run; else counts it and releases `g` (mu_) for
  // the fallback's call.
  bool to_fallback(const char* op, const cuda_ipc::RouteQuery& q, std::unique_lock<std::mutex>& g);
  // The common start of an IPC call (mu_ held): raises if the communicator
  // failed, or if the stream is capturing a CUDA graph and the call is not
  // `capturable`; for a `phased` call (every collective: its steps are
  // numbered by the control block's phase sequence) orders the stream after
  // the last phased call's; sets the flag-wait timeout, counts the call; the
  // stream to use. Point to point is not phased: each pair's messages are
  // ordered by the pair's own stream (p2p_stream), whatever the caller's.
  c10::cuda::CUDAStream begin_ipc(const char* op, const at::Tensor& t, std::chrono::milliseconds timeout,
                                  bool capturable = false, bool phased = true);
  // An event of the IPC device, from the process-wide cache.
  PooledEvent ipc_event() const { return PooledEvent::take(c10::DeviceIndex(device_)); }
  c10::cuda::CUDAStream begin_ipc(const char* op, int device, std::chrono::milliseconds timeout,
                                  bool capturable = false, bool phased = true);
  // The offset of `t` (whole) in this rank's registered region, or -1.
  int64_t registered_offset(const at::Tensor& t) const;
  // The Work of an IPC call enqueued on `stream`; `host_wait`: its wait()
  // blocks the host until the call is done (barrier), as FASTPAR_BLOCKING_WAIT
  // makes every Work's.
  c10::intrusive_ptr<c10d::Work> ipc_work(c10d::OpType type, const char* op, std::vector<at::Tensor> outputs,
                                          const c10::cuda::CUDAStream& stream, std::chrono::milliseconds timeout,
                                          bool host_wait = false);
  // send / recv over the IPC rings (ipc_p2p.h) where set up and routed, else the fallback.
  Work point_to_point(const char* op, at::Tensor& t, int peer, int tag, bool is_send);
  // all_to_all with per-rank sizes over the p2p rings (mu_ held): rank r's
  // ins[q] (in_bytes[q]) lands in rank q's outs[r]; every pair's send and
  // receive on the pair's streams, the own block copied on the caller's
  // stream, which then waits for all of them (the Work completes there).
  // The receiver checks each message's size against out_bytes, so splits
  // that disagree between two ranks fail instead of being misread. `keep`
  // is recorded on the side streams; `after` runs on the caller's stream
  // once everything has landed (copies out of staged outputs).
  c10::intrusive_ptr<c10d::Work> all_to_all_pairs(const char* op, c10d::OpType type,
                                                  const std::vector<const void*>& ins,
                                                  const std::vector<int64_t>& in_bytes, const std::vector<void*>& outs,
                                                  const std::vector<int64_t>& out_bytes,
                                                  const std::vector<at::Tensor>& keep, std::vector<at::Tensor> outputs,
                                                  std::chrono::milliseconds timeout,
                                                  const std::function<void()>& after);

  // This rank's stream for messages to (is_send) or from `peer` (mu_ held).
  c10::cuda::CUDAStream p2p_stream(int peer, bool is_send);

  // The schedule choices in force onto the communicator (mu_ held).
  void set_schedules(cuda_ipc::IpcComm& c) const;

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<C10dEngine> fallback_;
  std::chrono::milliseconds timeout_;
  int64_t max_ipc_bytes_;
  int64_t slot_bytes_;
  bool blocking_wait_;
  bool fused_two_shot_;     // FASTPAR_CUDA_IPC_TWO_SHOT=fused (mu_)
  bool fused_collectives_;  // FASTPAR_CUDA_IPC_COLLECTIVES=fused (mu_)
  bool waiter_flags_ = false;  // the test hook's FASTPAR_CUDA_IPC_FLAGS=waiter (mu_)
  // Registered buffers' bookkeeping; shared with the tensors' deleters.
  std::shared_ptr<RegisteredArena> registered_;

  mutable std::mutex mu_;      // setup and the IPC communicator's state (phase numbers, slots)
  bool set_up_ = false;
  int device_ = -1;            // this rank's IPC device, from the first CUDA all_reduce
  std::shared_ptr<IpcLink> link_;  // null: every CUDA call goes to the fallback
  std::string why_not_;        // why link_ is null, once set up
  bool group_shares_gpu_ = false;  // from setup, equal on every rank
  cuda_ipc::Mps mps_ = cuda_ipc::Mps::kUnknown;
  std::atomic<int64_t> ipc_calls_{0}, fallback_calls_{0}, direct_calls_{0};
  // Whether the current stream of the call begin_ipc started is capturing a
  // CUDA graph: asked once per call (mu_ held).
  bool call_captured_ = false;
  std::atomic<int64_t> one_shot_max_bytes_{-1};
  std::vector<std::optional<c10::cuda::CUDAStream>> send_streams_, recv_streams_;  // per peer, taken at first p2p
  std::vector<cudaStream_t> own_streams_;  // those streams, given back to the cache by release_ipc
  // The stream of the last phased IPC call (begin_ipc): a call on another
  // stream waits for it, so the GPU runs the calls in the order the host
  // numbered them.
  std::optional<c10::cuda::CUDAStream> last_ipc_stream_;
};

// Helpers of the CUDA engine's files (cuda_engine*.cpp).
namespace cuda_args {

// The dtype the IPC descriptors carry (peers compare it; a mismatch message
// names it): fastpar's DType, or kForeignDType + torch's code for dtypes the
// copy collectives move but fastpar has no element math for.
inline int32_t descriptor_dtype(const at::Tensor& t) {
  const std::optional<DType> d = maybe_dtype(t.scalar_type());
  return d ? int32_t(*d) : kForeignDType + int32_t(t.scalar_type());
}

// The tag of the messages all_to_all_pairs sends: no int tag of a user's
// send can equal it, so a user's message and an all-to-all's between the same
// two ranks can never be taken for one another.
constexpr int64_t kAllToAllTag = INT64_MIN + 1;

// Output list entries the kernels cannot write directly: add() returns `t`'s
// data if contiguous, else a contiguous temporary's, whose copy back into `t`
// finish() queues (on the current stream, after the kernels).
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

// Whether the call's op reduces `dt` on the kernels: the route's op_supported.
inline bool reduces(const std::optional<DType>& dt, const Call& c) {
  return dt.has_value() && !c.foreign && int(c.op) <= int(ReduceOp::MAX);  // every op reduces every kernel dtype
}

}  // namespace cuda_args

}  // namespace distributed
}  // namespace fastpar
