// fastpar's torch.distributed backend: the one c10d::Backend torch creates
// for "fastpar" and hands every device of the group.
//
// Each call is written once, for every device: the front checks its
// arguments (checks.h: one table of messages), picks the engine that serves
// its tensors (engine_for) and hands it the checked call:
//   CPU tensors   ShmEngine (one host) or HierarchicalEngine (several hosts:
//                 ShmEngine inside each, gloo between the hosts' leaders)
//   CUDA tensors  the engine the group was created with: CudaEngine (one
//                 host: CUDA IPC, NCCL as its fallback) or HierarchicalEngine
//                 over CudaEngines (NCCL between hosts); none in CPU-only
//                 builds or without a GPU, and CUDA tensors then get an error
// It alone speaks c10d: forms torch spells several ways (list / flat /
// coalesced, the torchcomms `*_single` names of torch 2.14) reach the engines
// as the operations of engine.h, in fastpar's types, so adding a collective
// means one method here, one entry per engine and one test.
//
// Coalescing (startCoalescing / endCoalescing, which batch_isend_irecv and
// torch's coalescing manager use): the calls in between run as they come
// and endCoalescing returns one Work over all of them; a call in between
// that fails (DistBackendError) raises at that Work's wait(), not at the
// call (backend.cpp, record, says why).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>


#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "hierarchical_engine.h"
#include "knobs.h"
#include "shm_engine.h"

namespace fastpar {
namespace distributed {

class Staging;  // staging.h

class Backend : public c10d::Backend {
 public:
  // The group's engines, which fastpar/distributed/backend.py builds: `shm`
  // for this host's ranks; on several hosts `hierarchical`, the
  // HierarchicalEngine over `shm` and the gloo groups between hosts (null on
  // one host); `cuda` the engine for CUDA tensors, or null.
  Backend(int rank, int size, std::chrono::milliseconds timeout, c10::intrusive_ptr<ShmEngine> shm,
          c10::intrusive_ptr<HierarchicalEngine> hierarchical, c10::intrusive_ptr<Engine> cuda);
  // Drops the engines without the GIL (engine.h: drop_without_gil).
  ~Backend() override;

  const std::string getBackendName() const override { return "fastpar"; }
  c10::intrusive_ptr<Options> getBackendOptions() override;
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return calls_; }
  void setTimeout(std::chrono::milliseconds timeout) override;
  void shutdown() override;
  void abort() override;
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  // Sparse tensors (COO), as gloo: SUM only; every rank's indices and values
  // gathered, summed in rank order, copied back into the input.
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
#if FASTPAR_TORCH_AT_LEAST(2, 14)  // gather_single / gather_into_tensor are new in torch 2.14
  c10::intrusive_ptr<c10d::Work> gather_into_tensor(at::Tensor& output, at::Tensor& input,
                                                    const c10d::GatherOptions& opts) override;
#endif
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  // As gloo's, over the CPU engine's send / recv: rank 0 waits for every rank
  // within the timeout and names the ranks that did not arrive (all of them
  // with wait_all_ranks), then lets them go; the others wait for rank 0. On
  // several hosts, gloo's own over every rank.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

  // fastpar.distributed.all_reduce / broadcast / all_gather_into_tensor: the
  // collective itself, synchronous, without torch's Python wrapper, the op
  // dispatcher or a Work (latency-critical code such as tensor-parallel
  // inference). Same checks and errors as the c10d entry points.
  void direct_all_reduce(const at::Tensor& t, int64_t op);
  void direct_broadcast(const at::Tensor& t, int64_t root);
  void direct_all_gather_into_tensor(const at::Tensor& output, const at::Tensor& input);

  // A tensor on `device` in memory every peer maps: this host's shared
  // segment (CPU) or CUDA IPC arena (collective: every rank of the group calls
  // it with the same sizes, in the same order).
  at::Tensor registered_empty(const std::vector<int64_t>& sizes, at::ScalarType dtype, const at::Device& device);
  bool is_registered(const at::Tensor& t) const;
  bool hierarchical() const { return bool(cpu_hier_); }
  int local_size() const { return shm_->size(); }
  // Collectives this rank ran with a hierarchical schedule (tests check an op
  // did not go to the world gloo group).
  int64_t hierarchical_calls() const;
  // The CPU all_reduce's schedule between hosts ("leaders" or "sharded"), or
  // "" on one host.
  std::string hosts_allreduce() const;
  c10::intrusive_ptr<Engine> cuda_engine() const { return cuda_; }
  void set_allreduce_tuning(int64_t one_shot_max_bytes, int algo);
  // This host's shared-memory engine (placement: shm_placement.h).
  ShmEngine& shm() { return *shm_; }
  c10::intrusive_ptr<ShmEngine> shm_engine() const { return shm_; }

 private:
  // The engine for tensors like `t` (named `name` in `op`'s errors).
  Engine& engine_for(const char* op, const std::string& name, const at::Tensor& t);
  // The engine for CPU tensors and for calls that name no tensor.
  Engine& cpu_engine() { return cpu_hier_ ? static_cast<Engine&>(*cpu_hier_) : static_cast<Engine&>(*shm_); }
  // A checked call on tensors like `t`: `call(engine, staging)` runs it on
  // engine_for(op, name, t) with its tensors passed through `staging`
  // (staging.h: CPU tensors that are not contiguous go as contiguous copies,
  // copied back once the Work is done); the Work is recorded.
  template <class F>
  c10::intrusive_ptr<c10d::Work> dispatch(const char* op, const std::string& name, const at::Tensor& t, F&& call);
  // Runs `call` (it returns the call's Work) in the profiler's range
  // "fastpar:<op>" (call_range.h) and counts it; inside a coalescing block,
  // keeps its Work for endCoalescing, and a failure becomes that Work's error
  // (backend.cpp says why).
  template <class F>
  c10::intrusive_ptr<c10d::Work> record(const char* op, const at::Tensor& input, F&& call);

  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<ShmEngine> shm_;
  c10::intrusive_ptr<HierarchicalEngine> cpu_hier_;  // several hosts: over shm_, leaders and world
  c10::intrusive_ptr<Engine> cuda_;             // CudaEngine / HierarchicalEngine, or null
  std::atomic<uint64_t> calls_{0};
  std::mutex coalescing_mu_;
  std::optional<std::vector<c10::intrusive_ptr<c10d::Work>>> coalesced_;  // set between start/endCoalescing
  std::vector<c10::intrusive_ptr<c10d::Work>> late_tokens_;  // monitoredBarrier's unanswered receives
};

}  // namespace distributed
}  // namespace fastpar
