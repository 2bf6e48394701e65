// The engine for CPU tensors of one host (engine.h): the ranks of this host
// map each other's POSIX shared-memory segments (core/transport/cpu_shm) and
// run the schedules of core/executors/cpu_shm on them.
//
// Its ranks are the host's (rank = this rank's index among them): on one host
// the group; on several, HierarchicalEngine runs its steps inside each host.
// Collectives run on the calling thread (a hand-off to a worker would cost
// more than a small collective) and return a completed Work, so a failure
// raises from the call itself. Point to point (shm_engine_p2p.cpp) runs on its
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

  void set_timeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }
  // destroy_process_group: peers stop counting on this rank (shm_p2p.h,
  // "Peers that go"), even if registered tensors keep the communicator alive.
  void shutdown() override { comm_->leave(); }
  // Aborts the communicator with `reason` (ShmComm::abort_with).
  void abort_with(const std::string& reason) override;

  Work all_reduce(at::Tensor& t, const Call& c) override;
  void all_reduce_now(at::Tensor& t, const Call& c) override;
  Work broadcast(at::Tensor& t, const Call& c) override;
  Work reduce(at::Tensor& t, const Call& c) override;
  Work all_gather(std::vector<at::Tensor>& outs, at::Tensor& in, const Call& c) override;
  Work all_gather_into(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins, const Call& c) override;
  Work gather(std::vector<at::Tensor>& outs, at::Tensor& in, const Call& c) override;
  Work scatter(at::Tensor& out, std::vector<at::Tensor>& ins, const Call& c) override;
  Work reduce_scatter(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins, const Call& c) override;
  Work all_to_all(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits, std::vector<int64_t>& in_splits,
                  const Call& c) override;
  Work barrier(const Call& c) override;
  Work send(at::Tensor& t, int peer, int tag) override;
  Work recv(at::Tensor& t, int peer, int tag) override;

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
  void set_placement_test_hooks(double near_us, double far_us, double noise_us, int64_t revisit_calls,
                                int64_t recheck_calls);
  // The CPUs this host's ranks may run on, and whether they outnumber them
  // (ShmComm::cpus, crowded: waits then yield at once).
  int cpus() const { return comm_->cpus(); }
  bool crowded() const { return comm_->crowded(); }

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
  Work spare_allreduce_;
};

}  // namespace distributed
}  // namespace fastpar
