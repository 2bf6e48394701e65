// fastpar as a torch.distributed backend: a c10d::Backend whose collectives run
// on the cpu_shm transport inside a host and, when ranks span several hosts,
// hierarchically: shm inside each host, a gloo group of the host leaders (the
// lowest rank of each host) between hosts. Hierarchical schedules
// (HierarchicalBackend over this host's shm steps: shm_backend_hierarchical.cpp;
// steps and bytes in docs/algorithms.md):
//   allreduce, barrier, broadcast, reduce, all_gather(+_into_tensor),
//   reduce_scatter(+_tensor): shm step(s) in the host, one gloo call among
//   leaders carrying each host's data once;
//   gather, scatter, all_to_all: a gloo group over all ranks (`world`).
// Hosts may hold different numbers of ranks and interleave in group rank.
//
// CUDA tensors: torch creates this one object for every device of "fastpar"
// (its devices are cpu and cuda, and torch calls the creator once when all
// devices map to one backend name), so each collective forwards calls whose
// tensors are CUDA to `cuda` (CudaBackend, cuda_backend.h) when the group has
// one; barrier stays here. Without one, CUDA tensors get an error.
//
// Point to point (send / recv / recv from any source) runs on its own
// channels (shm_p2p.h) and returns works that wait() drives to completion.
//
// Collectives execute synchronously on the calling thread (a spin-waiting
// shared-memory collective finishes in microseconds; a worker thread hand-off
// would cost more than the work) and return an already-completed Work, so
// async_op=True, wait() and get_future() behave as torch's. A failure throws
// from the call itself.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/extension.h>

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "../../core/executors/cpu_shm/shm_collectives.h"
#include "../../core/transport/cpu_shm/shm_comm.h"
#include "../../core/executors/cpu_shm/shm_p2p.h"
#include "hierarchical_backend.h"

namespace fastpar {
namespace distributed {

class ShmBackend : public c10d::Backend {
 public:
  // `local_ranks`: the group ranks on this host, ascending, including `rank`.
  // `leaders`: gloo group of the lowest rank of every host (only on those
  // ranks, and only when there are several hosts); `world`: gloo over all
  // ranks, for the collectives without a hierarchical schedule. `hosts`: the
  // host index of every group rank (hosts numbered in order of their lowest
  // rank, so host h's leader is rank h of `leaders`); needed with `world`.
  ShmBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout,
             std::vector<int> local_ranks, std::vector<int> global_ranks,
             c10::intrusive_ptr<c10d::Backend> leaders, c10::intrusive_ptr<c10d::Backend> world,
              std::vector<int> hosts = {}, c10::intrusive_ptr<c10d::Backend> cuda = nullptr);

  const std::string getBackendName() const override { return "fastpar"; }
  c10::intrusive_ptr<Options> getBackendOptions() override;
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return calls_; }
  void setTimeout(std::chrono::milliseconds timeout) override {
    timeout_ = timeout;
    if (cuda_) cuda_->setTimeout(timeout);
  }
  // destroy_process_group: peers stop counting on this rank (shm_p2p.h,
  // "Peers that go"), even if registered tensors keep comm_ alive.
  void shutdown() override {
    if (cuda_) cuda_->shutdown();
    comm_->leave();
  }
  void abort() override {
    if (cuda_) cuda_->abort();
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  // Coalesced forms: CUDA tensors only (through the CUDA backend).
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  // Point to point (shm_backend_p2p.cpp): cpu_shm channels in a host, the
  // world gloo group across hosts.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

  // fastpar.distributed.all_reduce / broadcast / all_gather_into_tensor: the
  // collective itself, synchronous, without torch's Python wrapper, the op
  // dispatcher or a Work (latency-critical code such as tensor-parallel
  // inference). Same checks and errors as the c10d entry points; `root` is a
  // group rank.
  void direct_all_reduce(const at::Tensor& t, int64_t op);
  void direct_broadcast(const at::Tensor& t, int64_t root);
  void direct_all_gather_into_tensor(const at::Tensor& output, const at::Tensor& input);

  // A tensor in this rank's registered arena (collective: every rank of the
  // group calls it with the same sizes, in the same order).
  at::Tensor registered_empty(const std::vector<int64_t>& sizes, at::ScalarType dtype);
  bool is_registered(const at::Tensor& t) const;
  bool hierarchical() const { return bool(world_); }
  int local_size() const { return comm_->size(); }
  // Collectives this rank ran with a hierarchical schedule, barrier excepted
  // (tests check it moves, i.e. that an op did not go to the world gloo group).
  uint64_t hierarchical_calls() const { return hier_ ? uint64_t(hier_->hierarchical_calls()) : 0; }
  c10::intrusive_ptr<c10d::Backend> cuda_backend() const { return cuda_; }
  // Benchmarks flip schedules at run time (every rank must set the same).
  void set_allreduce_tuning(int64_t one_shot_max_bytes, int algo);

 private:
  // Sets the per-call timeout on the comm and serializes calls.
  std::unique_lock<std::mutex> start(std::chrono::milliseconds t);
  c10::intrusive_ptr<c10d::Work> done(c10d::OpType type, std::vector<at::Tensor> outputs);
  int local_root(const char* op, int64_t root) const;
  // Whether a call on these tensors goes to the CUDA backend: one device-type
  // test, so the CPU path pays nothing measurable.
  bool for_cuda(const at::Tensor& t) const { return cuda_ && t.is_cuda(); }
  bool for_cuda(const std::vector<at::Tensor>& ts) const { return cuda_ && !ts.empty() && ts[0].is_cuda(); }

  // Several hosts (shm_backend_hierarchical.cpp): checks the layout and
  // builds hier_, which the collectives with a hierarchical schedule call
  // with checked arguments.
  void init_hosts(std::vector<int> hosts);

  std::shared_ptr<cpu_shm::ShmComm> comm_;
  std::shared_ptr<cpu_shm::ShmP2P> p2p_;  // point to point over comm_'s segments
  cpu_shm::ShmTuning tuning_;
  std::chrono::milliseconds timeout_;
  std::vector<int> local_ranks_;
  c10::intrusive_ptr<c10d::Backend> leaders_, world_;
  c10::intrusive_ptr<c10d::Backend> cuda_;  // CudaBackend, or null (CPU-only build, no GPU)
  std::mutex mu_;
  uint64_t calls_ = 0;
  // Several hosts only: the hierarchical schedules over this host's comm_,
  // leaders_ and world_.
  c10::intrusive_ptr<HierarchicalBackend> hier_;
};

// Adds fastpar._C.ShmBackend and helpers to the extension module.
void register_distributed(pybind11::module& m);

}  // namespace distributed
}  // namespace fastpar
