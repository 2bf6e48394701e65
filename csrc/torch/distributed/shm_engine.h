// The engine for CPU tensors of one host (engine.h): the ranks of this host
// map each other's POSIX shared-memory segments (core/transport/cpu_shm) and
// run the schedules of core/executors/cpu_shm on them.
//
// It is a c10d::Backend over the host's ranks (rank = this rank's index among
// them): on one host that is the group; on several, HierarchicalEngine takes
// its reduce / broadcast / gather / scatter as the steps inside each host.
//
// Collectives run synchronously on the calling thread (a spin-waiting
// shared-memory collective finishes in microseconds; a hand-off to a worker
// thread would cost more than the work) and return an already-completed Work,
// so async_op=True, wait() and get_future() behave as torch's; a failure
// throws from the call itself. Point to point (shm_engine_p2p.cpp) runs on its
// own channels and returns Works that wait() drives to completion.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <memory>
#include <mutex>

#include "../../core/executors/cpu_shm/shm_collectives.h"
#include "../../core/executors/cpu_shm/shm_p2p.h"
#include "../../core/transport/cpu_shm/shm_comm.h"
#include "engine.h"

namespace fastpar {
namespace distributed {

class ShmEngine : public Engine {
 public:
  // `global_ranks[i]`: the torch rank of this host's i-th rank (for messages).
  ShmEngine(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::vector<int> global_ranks,
            const cpu_shm::ShmOptions& options, const cpu_shm::ShmTuning& tuning);

  void setTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }
  // destroy_process_group: peers stop counting on this rank (shm_p2p.h,
  // "Peers that go"), even if registered tensors keep the communicator alive.
  void shutdown() override { comm_->leave(); }
  // Aborts the communicator with `reason` (ShmComm::abort_with).
  void abort_with(const std::string& reason) override;

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  // In place on the root; other ranks' tensors are left alone.
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

  // allreduce() without its Work or tensor list.
  void allreduce_direct(at::Tensor& t, const c10d::AllreduceOptions& opts) override;
  at::Tensor registered_empty(const std::vector<int64_t>& sizes, at::ScalarType dtype, int device) override;
  bool is_registered(const at::Tensor& t) const override;
  // Benchmarks flip schedules at run time (every rank must set the same).
  void set_allreduce_tuning(int64_t one_shot_max_bytes, int algo);
  // The placement the two-shot allreduce measured and runs for (shm_placement.h);
  // set_placement forces or releases it (every rank the same), mark_drifted is
  // the tests' way to make this rank report drift, set_placement_test_hooks
  // theirs to make a form slower or the measurement noisy (Placement::set_test_hooks).
  cpu_shm::PlacementReport placement() const;
  void set_placement(cpu_shm::PlacementMode mode);
  void mark_placement_drifted();
  void set_placement_test_hooks(double near_us, double far_us, double noise_us, int64_t revisit_calls);

 private:
  // Serializes calls and sets the call's timeout on the communicator.
  std::unique_lock<std::mutex> start(std::chrono::milliseconds t);

  std::shared_ptr<cpu_shm::ShmComm> comm_;
  std::shared_ptr<cpu_shm::ShmP2P> p2p_;  // point to point over comm_'s segments
  cpu_shm::ShmTuning tuning_;
  cpu_shm::Placement placement_;  // guarded by mu_
  std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  // The Work allreduce returned last, handed out again (refilled) when its
  // caller has dropped it: dist.all_reduce drops it after wait(), so the hot
  // path allocates no Work. Guarded by mu_.
  c10::intrusive_ptr<c10d::Work> spare_allreduce_;
};

// Adds fastpar._C.ShmEngine (after fastpar._C.Engine).
void register_shm_engine(pybind11::module& m);

}  // namespace distributed
}  // namespace fastpar
