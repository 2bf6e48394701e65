// What every fastpar engine is: a c10d::Backend over some ranks that runs
// calls the front (backend.h) has already checked, so an engine never checks
// arguments again. The engines:
//   ShmEngine           CPU tensors of one host, over shared memory, synchronous
//   CudaEngine          CUDA tensors of one host, over CUDA IPC, stream-ordered,
//                       with NCCL as its fallback for the calls IPC does not serve
//   HierarchicalEngine  several hosts: one of the above per host, gloo / NCCL
//                       between the hosts' leaders
// Engine writes, once, the forms of a call that are other forms in a loop or
// over a packed tensor; an engine overrides one where it has a faster path.
#pragma once

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/headeronly/version.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/extension.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

// Names of c10d that differ between the torch releases fastpar builds against.
// The GPU machine runs torch 2.11 while CI builds with 2.14, so a name that
// only newer torch has must come through here (scripts/check_torch_compat.py
// compiles every torch-facing source against the older headers).
#define FASTPAR_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace fastpar {
namespace distributed {

// The op types a Work reports for the tensor forms of coalesced collectives:
// torch 2.12 added REDUCE_SCATTER_TENSOR_COALESCED, torch 2.14
// ALLGATHER_INTO_TENSOR_COALESCED; before them ProcessGroupNCCL reported
// COALESCED, and so do we.
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

// The timeout one collective waits for: torch passes the caller's in every
// call's options (0 when none was given), and then the group's applies.
inline std::chrono::milliseconds call_timeout(std::chrono::milliseconds given, std::chrono::milliseconds group) {
  return given.count() > 0 ? given : group;
}

// A timeout in nanoseconds for the kernels' flag waits, saturating
// (timedelta.max is ~1e17 ms; times a million it would wrap).
inline uint64_t timeout_ns(std::chrono::milliseconds t) {
  const uint64_t ms = t.count() > 0 ? uint64_t(t.count()) : 0;
  return ms > ~uint64_t(0) / 1000000 ? ~uint64_t(0) : ms * 1000000;
}

// How transport failures reach torch.distributed users. The transports are
// torch-free and throw std exceptions: std::invalid_argument for a bad call
// (raised before any rank waits) and std::runtime_error for a failed
// collective (timeout, dead, aborted or mismatched peer). Here they become
// ValueError and torch.distributed.DistBackendError, as other backends' are.
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

class Engine : public c10d::Backend {
 public:
  using c10d::Backend::Backend;
  const std::string getBackendName() const override { return "fastpar"; }

  // all_reduce of one contiguous tensor the front has checked, without a Work
  // (fastpar.distributed.all_reduce): when it returns, the call is done (CPU)
  // or enqueued on the caller's current stream (CUDA), and a failure this rank
  // knows of is raised. By default allreduce() and its Work's wait().
  virtual void allreduce_direct(at::Tensor& t, const c10d::AllreduceOptions& opts);

  // Each entry in turn.
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  // The list forms over the flat ones: inputs packed with cat, outputs
  // copied out of a packed result.
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  // Sparse tensors (COO), as gloo: SUM only; every rank's indices and values
  // gathered (_allgather_base), summed in rank order, copied back into the
  // input.
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
  // As gloo's, over send / recv: rank 0 waits for every rank within the
  // timeout and names the ranks that did not arrive (all of them with
  // wait_all_ranks), then lets them go; the others wait for rank 0.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  // A tensor in memory every peer maps (fastpar.distributed.registered_empty;
  // collective), on cuda:`device` for CUDA engines; engines without such
  // memory refuse.
  virtual at::Tensor registered_empty(const std::vector<int64_t>& sizes, at::ScalarType dtype, int device);
  virtual bool is_registered(const at::Tensor& t) const;
  // Fails this engine for a cause outside it (a HierarchicalEngine's leader
  // whose step between hosts failed, while the host's other ranks wait for
  // it in this engine): the peers raise at once with `reason`, and this
  // rank's later calls raise. Engines that cannot tell their peers do
  // nothing (the peers raise at their timeout, or when this process exits).
  virtual void abort_with(const std::string& /*reason*/) {}

#if FASTPAR_TORCH_AT_LEAST(2, 14)  // gather_single / gather_into_tensor are new in torch 2.14
  // gather into one flat tensor on the root: gather into its rows.
  c10::intrusive_ptr<c10d::Work> gather_into_tensor(at::Tensor& output, at::Tensor& input,
                                                    const c10d::GatherOptions& opts) override;
#endif

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> late_tokens_;  // monitoredBarrier's unanswered receives
};

// Resets `owned` (the gloo / NCCL groups and engines an object holds), without
// the GIL when this thread holds it. gloo's and NCCL's destructors wait for
// their worker threads, and a worker may at that moment be freeing a finished
// Work whose tensors have Python objects, which takes the GIL; Python frees
// fastpar's backend objects while holding it (pybind), so dropping their
// groups with it can deadlock: a 2-host group's destroy_process_group did,
// about once in ten (tests/faults: test_fake_hosts_exit). torch's own
// ProcessGroup holder releases the GIL for the same reason.
template <class... Owned>
void drop_without_gil(Owned&... owned) {
  std::optional<pybind11::gil_scoped_release> no_gil;
  if (Py_IsInitialized() && PyGILState_Check()) no_gil.emplace();
  (owned.reset(), ...);
}

// A Work for a call whose steps are all enqueued: its Future holds `outputs`
// and is complete on the current stream of their device (at once on the CPU).
c10::intrusive_ptr<c10d::Work> enqueued_work(std::vector<at::Tensor> outputs);

}  // namespace distributed
}  // namespace fastpar
