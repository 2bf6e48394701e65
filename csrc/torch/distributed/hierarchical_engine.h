// The engine for ranks on several hosts (engine.h), composed of three
// engines:
//   local    this host's ranks, in group-rank order (an engine whose reduce
//            leaves non-root tensors alone: the ShmEngine for CPU tensors,
//            the CudaEngine for CUDA)
//   leaders  each host's lowest rank, hosts in order of their lowest rank
//            (gloo or NCCL between hosts); null on ranks that do not lead a host
//   world    every rank of the group (gloo or NCCL)
// (leaders and world, and the columns below, are C10dEngines between hosts:
// c10d_engine.h.)
// all_reduce, broadcast, reduce, all_gather (+ all_gather_into_tensor and
// their coalesced forms) and reduce_scatter (+ reduce_scatter_tensor and its
// coalesced form) run as local steps inside each host around one call among
// the leaders, which carries each host's data across hosts once; everything
// else, and reductions other than SUM/AVG/PRODUCT/MIN/MAX, goes to `world`. These are fastpar's only hierarchical schedules:
// the front (backend.h) builds one over its ShmEngine for CPU tensors, and
// fastpar.distributed one over a CudaEngine for CUDA tensors on several
// hosts; docs/algorithms.md ("Several hosts") gives their steps and bytes.
// The front has checked every call: this engine only decides which calls
// its schedules serve.
//
// Streams: every step's Work is waited before the next step starts. For CUDA
// backends (fastpar's IPC Work, NCCL's) wait() orders the caller's current
// stream after the step without blocking the host, so a whole call is
// enqueued on the caller's stream and the host never waits for the GPU. The
// returned Work holds a Future marked complete on the current stream of the
// tensors' device after the last step: wait() and the Future's consumers
// (then(), DDP comm hooks) run after the GPU has finished the call.
// isCompleted() says the call was enqueued, not that the GPU has run it.
//
// Errors: every call to `leaders` and `world` goes through
// c10d_engine.h, so a failure between hosts (gloo's "Connection
// closed by peer", a timeout) raises DistBackendError naming the op and the
// rank, with the inter-host backend's message, in the hierarchical schedules
// and in the calls handed whole to `world` alike. A leader whose step among
// the leaders fails aborts `local` with that error before raising
// (Engine::abort_with), so its host's other ranks, which wait for it in
// `local`, raise at once naming it and the error, not at their timeout or
// when its process exits; `local` stays failed. Given the group's store, a
// failed call is also posted to every rank of the group (failure_notice.h):
// a rank waiting in gloo for a peer that has given up raises within one or
// two poll intervals, not at the timeout, and every call after a failure
// raises at once.
//
// all_reduce has two schedules between hosts. "leaders" (above): each host's
// data crosses once, through its leader. "sharded" (given `columns`): a local
// reduce_scatter leaves each rank of a host one k-th of the host's sum, the
// ranks of one local index (a column, one per host) all_reduce their shard
// between hosts, and a local all_gather puts the shards together. The same
// bytes cross the hosts; every rank carries its own share (its own NIC, core
// and connection where it has them). Only where every host has the same
// number k >= 2 of ranks.
//
// Reductions: AVG runs as SUM and is divided once by the group size, where
// the final value is formed (integers: truncated toward zero). What crosses
// between hosts crosses as bytes where the step copies, and complex sums as
// real and imaginary parts (c10d_engine.h), so every dtype the local
// engine takes goes through.
#pragma once

#include "c10d_engine.h"
#include "engine.h"
#include "failure_notice.h"

#include <chrono>
#include <memory>
#include <vector>

namespace fastpar {
namespace distributed {

class HierarchicalEngine : public Engine {
 public:
  // host_of[r]: rank r's host, hosts numbered in order of their lowest rank.
  // leaders, world, columns: gloo or NCCL groups (see above); columns: null,
  // or the group of the ranks of this rank's local index on every host (rank
  // = host index), which selects the sharded all_reduce.
  // store: the group's, for its failure notice (failure_notice.h), polled
  // every `failure_poll`; without one, or at 0, a rank hears of a failure on
  // another host only from gloo.
  HierarchicalEngine(int rank, int size, std::vector<int> host_of, c10::intrusive_ptr<Engine> local,
                     c10::intrusive_ptr<c10d::Backend> leaders, c10::intrusive_ptr<c10d::Backend> world,
                     c10::intrusive_ptr<c10d::Backend> columns = nullptr,
                     c10::intrusive_ptr<c10d::Store> store = nullptr,
                     std::chrono::milliseconds failure_poll = std::chrono::milliseconds(0));
  // Drops the groups without the GIL (engine.h: drop_without_gil).
  ~HierarchicalEngine() override;

  void set_timeout(std::chrono::milliseconds timeout) override;
  void shutdown() override;
  void abort() override;

  // local reduce, the leaders' all_reduce (or local reduce_scatter, the
  // columns' all_reduce, local all_gather), local broadcast
  Work all_reduce(at::Tensor& t, const Call& c) override;
  // local broadcast on the root's host, the leaders' broadcast, local broadcast elsewhere
  Work broadcast(at::Tensor& t, const Call& c) override;
  // local reduce, the leaders' reduce to the root's host, into copies where the root does not lead
  Work reduce(at::Tensor& t, const Call& c) override;
  // local gather to the leader, the leaders' exchange of host blocks, local broadcast
  Work all_gather(std::vector<at::Tensor>& outs, at::Tensor& in, const Call& c) override;
  Work all_gather_into(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins, const Call& c) override;
  // local reduce to the leader, the leaders' reduce_scatter of host blocks, local scatter
  Work reduce_scatter(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins, const Call& c) override;
  // `world`'s.
  Work gather(std::vector<at::Tensor>& outs, at::Tensor& in, const Call& c) override;
  Work scatter(at::Tensor& out, std::vector<at::Tensor>& ins, const Call& c) override;
  Work all_to_all(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits, std::vector<int64_t>& in_splits,
                  const Call& c) override;
  Work send(at::Tensor& t, int peer, int tag) override;
  Work recv(at::Tensor& t, int peer, int tag) override;
  Work barrier(const Call& c) override;

  c10::intrusive_ptr<Engine> local() const { return local_; }
  // The gloo / NCCL groups themselves (this engine calls them through
  // C10dEngines, which raise their failures as DistBackendError).
  c10::intrusive_ptr<c10d::Backend> leaders() const;
  c10::intrusive_ptr<c10d::Backend> world() const;
  c10::intrusive_ptr<c10d::Backend> columns() const;
  // all_reduce's schedule between hosts: "sharded" or "leaders".
  const char* hosts_allreduce() const { return columns_ ? "sharded" : "leaders"; }
  int64_t hierarchical_calls() const { return hier_calls_; }

 private:
  // Whether this rank leads its host (only leaders take the leaders' steps).
  bool leads() const { return bool(leaders_); }
  // Runs `step`, this rank's call between hosts (among the leaders or in its
  // column) or its Work's wait; if it fails (argument errors aside), aborts
  // `local` with the error, naming `who` failed, before it propagates.
  template <class F>
  auto across_hosts(F&& step, const char* who = "this host's leader") -> decltype(step());
  // Runs `call`, the whole of one call `op`, under the failure notice: once
  // the group is known to have failed, raises at once; a failure of `call`
  // is posted to the group.
  template <class F>
  Work guarded(const char* op, F&& call);
  void allreduce_sharded(const at::Tensor& flat, ReduceOp op, std::chrono::milliseconds timeout, int64_t pieces);
  void all_gather_bytes(const at::Tensor& in, const at::Tensor& out, std::chrono::milliseconds timeout);
  void reduce_scatter_flat(const at::Tensor& output, const at::Tensor& input, ReduceOp op, bool avg,
                           std::chrono::milliseconds timeout);

  std::vector<int> host_of_;
  std::shared_ptr<FailureNotice> notice_;  // null: none (no store, or polling off)
  std::vector<std::vector<int>> host_ranks_;  // each host's ranks, ascending
  int host_ = 0;
  bool hosts_contiguous_ = true;  // host h's ranks follow host h-1's
  c10::intrusive_ptr<Engine> local_;
  c10::intrusive_ptr<C10dEngine> leaders_, world_, columns_;
  int64_t hier_calls_ = 0;
};


}  // namespace distributed
}  // namespace fastpar
