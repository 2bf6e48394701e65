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

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/utils/pybind.h>
#include <torch/extension.h>

#include "c10d_compat.h"

#include <optional>
#include <vector>

namespace fastpar {
namespace distributed {

class Engine : public c10d::Backend {
 public:
  using c10d::Backend::Backend;
  const std::string getBackendName() const override { return "fastpar"; }

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
  // A tensor in memory every peer maps (fastpar.distributed.registered_empty;
  // collective), on cuda:`device` for CUDA engines; engines without such
  // memory refuse.
  virtual at::Tensor registered_empty(const std::vector<int64_t>& sizes, at::ScalarType dtype, int device);
  virtual bool is_registered(const at::Tensor& t) const;

#if FASTPAR_TORCH_AT_LEAST(2, 14)  // gather_single / gather_into_tensor are new in torch 2.14
  // gather into one flat tensor on the root: gather into its rows.
  c10::intrusive_ptr<c10d::Work> gather_into_tensor(at::Tensor& output, at::Tensor& input,
                                                    const c10d::GatherOptions& opts) override;
#endif
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
