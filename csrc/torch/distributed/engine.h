// The interface between the front (backend.h, the one c10d::Backend torch
// sees) and the engines that run its calls:
//   ShmEngine           CPU tensors of one host, over shared memory
//   CudaEngine          CUDA tensors of one host, over CUDA IPC, NCCL as fallback
//   HierarchicalEngine  several hosts: an engine per host, gloo / NCCL between
//   C10dEngine          gloo or NCCL behind this interface (c10d_engine.h)
// Contract: the front has checked every call (an engine never checks
// arguments again), turned torch's list, coalesced and `*_single` spellings
// into these operations, and staged CPU tensors that are not contiguous. An
// operation returns the call's Work: complete (CPU engines) or enqueued on the
// caller's current stream (CUDA). A failed collective raises DistBackendError,
// a call an engine cannot serve ValueError (run_transport).
#pragma once

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/headeronly/version.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../core/kernels/reduce_ops.h"

// Names of c10d that differ between the torch releases fastpar builds against
// (scripts/check_torch_compat.py compiles every source against the oldest).
#define FASTPAR_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace fastpar {
namespace distributed {

using Work = c10::intrusive_ptr<c10d::Work>;

// The op types a Work reports for the coalesced tensor forms: torch 2.12 added
// REDUCE_SCATTER_TENSOR_COALESCED, 2.14 ALLGATHER_INTO_TENSOR_COALESCED; before
// them torch reported COALESCED, and so do we.
#if FASTPAR_TORCH_AT_LEAST(2, 14)
inline constexpr c10d::OpType kAllgatherIntoTensorCoalesced = c10d::OpType::ALLGATHER_INTO_TENSOR_COALESCED;
#else
inline constexpr c10d::OpType kAllgatherIntoTensorCoalesced = c10d::OpType::COALESCED;
#endif
#if FASTPAR_TORCH_AT_LEAST(2, 12)
inline constexpr c10d::OpType kReduceScatterTensorCoalesced = c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED;
#else
inline constexpr c10d::OpType kReduceScatterTensorCoalesced = c10d::OpType::COALESCED;
#endif

// What an operation is told besides its tensors.
struct Call {
  // The reduction, as the element math names it. `foreign` marks one it lacks
  // (PREMUL_SUM): only a foreign backend (NCCL) can run that, given `torch_op`.
  ReduceOp op = ReduceOp::SUM;
  bool foreign = false;
  const c10d::ReduceOp* torch_op = nullptr;  // the caller's, for the foreign backends; may be null
  int root = 0;                              // rooted operations, in the engine's ranks
  std::chrono::milliseconds timeout{0};      // 0: the group's
  int device = -1;                           // barrier: the CUDA device the caller named, or -1

  Call() = default;
  static Call rooted(int root, std::chrono::milliseconds timeout) {
    Call c;
    c.root = root;
    c.timeout = timeout;
    return c;
  }
  static Call reducing(ReduceOp op, std::chrono::milliseconds timeout, int root = 0) {
    Call c = rooted(root, timeout);
    c.op = op;
    return c;
  }
};

// The timeout a call waits for: its own, else the group's.
inline std::chrono::milliseconds call_timeout(std::chrono::milliseconds given, std::chrono::milliseconds group) {
  return given.count() > 0 ? given : group;
}

// A timeout in nanoseconds for the kernels' flag waits, saturating.
inline uint64_t timeout_ns(std::chrono::milliseconds t) {
  const uint64_t ms = t.count() > 0 ? uint64_t(t.count()) : 0;
  return ms > ~uint64_t(0) / 1000000 ? ~uint64_t(0) : ms * 1000000;
}

// The torch-free transports throw std::invalid_argument for a bad call (before
// any rank waits) and std::runtime_error for a failed collective; torch users
// get ValueError and DistBackendError, as from other backends.
template <class F>
void run_transport(F&& f) {
  try {
    f();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  } catch (const std::exception& e) {
    C10_THROW_ERROR(DistBackendError, e.what());
  }
}

class Engine : public c10::intrusive_ptr_target {
 public:
  Engine(int rank, int size) : rank_(rank), size_(size) {}
  ~Engine() override = default;
  int rank() const { return rank_; }
  int size() const { return size_; }

  virtual void set_timeout(std::chrono::milliseconds timeout) = 0;
  virtual void shutdown() {}
  virtual void abort() {}
  // Fails this engine for a cause outside it (a HierarchicalEngine's leader
  // whose step between hosts failed while its host waits for it here): peers
  // raise at once with `reason`, and this rank's later calls raise. Engines
  // that cannot tell their peers do nothing.
  virtual void abort_with(const std::string& /*reason*/) {}

  // In place: every rank's `t` becomes the reduction of all of them.
  virtual Work all_reduce(at::Tensor& t, const Call& c) = 0;
  virtual Work broadcast(at::Tensor& t, const Call& c) = 0;
  // In place on the root; other ranks' `t` is not written.
  virtual Work reduce(at::Tensor& t, const Call& c) = 0;
  // outs[r] receives rank r's `in` (any strides).
  virtual Work all_gather(std::vector<at::Tensor>& outs, at::Tensor& in, const Call& c) = 0;
  // The root's outs[r] receives rank r's `in`; other ranks pass no outs.
  virtual Work gather(std::vector<at::Tensor>& outs, at::Tensor& in, const Call& c) = 0;
  // `out` receives the root's ins[rank]; other ranks pass no ins.
  virtual Work scatter(at::Tensor& out, std::vector<at::Tensor>& ins, const Call& c) = 0;
  // Pair by pair: outs[i] receives this rank's block of the reduction of every
  // rank's ins[i] (size() blocks of outs[i]'s elements).
  virtual Work reduce_scatter(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins, const Call& c) = 0;
  // Rank r's rows in_splits[q] of `in` land in rank q's rows out_splits[r] of
  // `out`; empty splits: equal parts.
  virtual Work all_to_all(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits,
                          std::vector<int64_t>& in_splits, const Call& c) = 0;
  virtual Work barrier(const Call& c) = 0;
  virtual Work send(at::Tensor& t, int peer, int tag) = 0;
  // `peer` -1: from any rank (the Work's sourceRank() names it).
  virtual Work recv(at::Tensor& t, int peer, int tag) = 0;

  // Forms over the operations above; an engine overrides one where it has a
  // faster path.
  // all_reduce, done (CPU) or enqueued (CUDA) when it returns, without a Work.
  virtual void all_reduce_now(at::Tensor& t, const Call& c);
  virtual Work all_reduce_coalesced(std::vector<at::Tensor>& ts, const Call& c);
  // Pair by pair: outs[i] (size() blocks) receives every rank's ins[i].
  virtual Work all_gather_into(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins, const Call& c);

  // A tensor in memory every peer maps (collective), on cuda:`device` for
  // CUDA engines; engines without such memory refuse.
  virtual at::Tensor registered_empty(const std::vector<int64_t>& sizes, at::ScalarType dtype, int device);
  virtual bool is_registered(const at::Tensor& t) const;

 private:
  int rank_, size_;
};

// Runs `f`, releasing the GIL first when this thread holds it.
void call_without_gil(const std::function<void()>& f);

// Resets `owned` (engines and the gloo / NCCL groups they hold) without the
// GIL when this thread holds it: gloo's and NCCL's destructors join worker
// threads that may be freeing a Work whose tensors need the GIL, and Python
// frees fastpar's objects holding it (torch's ProcessGroup holder releases it
// for the same reason).
template <class... Owned>
void drop_without_gil(Owned&... owned) {
  call_without_gil([&] { (owned.reset(), ...); });
}

// A Work for a call whose steps are all enqueued: its Future holds `outputs`
// and is complete on the current stream of their device (at once on the CPU).
Work enqueued_work(std::vector<at::Tensor> outputs);

// Rank r's block of a flat tensor of size() blocks of `block` elements, as
// a view.
inline at::Tensor rank_block(const at::Tensor& flat, int64_t block, int r) {
  return flat.reshape({-1}).narrow(0, block * r, block);
}

}  // namespace distributed
}  // namespace fastpar
