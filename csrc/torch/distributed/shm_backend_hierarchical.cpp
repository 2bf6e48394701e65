// ShmBackend on several hosts. Its hierarchical collectives are
// HierarchicalBackend's schedules (hierarchical_backend.h: the one copy of
// them; CUDA tensors on several hosts run the same ones over CUDA IPC and
// NCCL) composed of this host's shared-memory communicator, seen as a c10d
// backend of the host's ranks (ShmHostSteps below), the gloo group of the
// hosts' leaders and the gloo group of every rank. docs/algorithms.md lists
// the steps and the bytes each rank moves.
#include <algorithm>

#include "../ops/checks.h"
#include "../ops/transport_errors.h"
#include "shm_backend.h"

namespace fastpar {
namespace distributed {

using namespace ::fastpar::ops;  // the argument checks and run_transport (csrc/torch/ops)

namespace {

ReduceOp step_op(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return ReduceOp::SUM;
    case c10d::ReduceOp::PRODUCT: return ReduceOp::PRODUCT;
    case c10d::ReduceOp::MIN: return ReduceOp::MIN;
    case c10d::ReduceOp::MAX: return ReduceOp::MAX;
    default: break;  // AVG never reaches a step: the schedules run it as SUM
  }
  TORCH_CHECK_VALUE(false, "fastpar: a hierarchical step got reduce op ", int(op.op_),
                    " (steps reduce with SUM, PRODUCT, MIN or MAX)");
}

char* ptr(const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }

// The four steps the schedules take inside a host (reduce to a root in
// place, broadcast, gather, scatter), each a cpu_shm collective on the
// owner's communicator, finished when it returns. Called only from the
// owner's collectives, under its lock and with its timeout already set
// (ShmBackend::start); the tensors are contiguous CPU tensors (checked by the
// owner, or made by the schedules).
class ShmHostSteps : public c10d::Backend {
 public:
  explicit ShmHostSteps(std::shared_ptr<cpu_shm::ShmComm> comm)
      : c10d::Backend(comm->rank(), comm->size()), comm_(std::move(comm)) {}
  const std::string getBackendName() const override { return "fastpar_host"; }
  void setTimeout(std::chrono::milliseconds) override {}  // the owner's applies

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& ts, const c10d::ReduceOptions& opts) override {
    const at::Tensor& t = ts[0];
    // Non-roots pass their input as `out`: cpu_shm::reduce writes only the root's.
    run_transport([&] {
      cpu_shm::reduce(*comm_, t.data_ptr(), t.data_ptr(), t.numel(), dtype(t), step_op(opts.reduceOp),
                      int(opts.rootRank));
    });
    return enqueued_work(ts);
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& ts, const c10d::BroadcastOptions& opts) override {
    const at::Tensor& t = ts[0];
    run_transport([&] { cpu_shm::broadcast(*comm_, t.data_ptr(), t.numel(), dtype(t), int(opts.rootRank)); });
    return enqueued_work(ts);
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outs, std::vector<at::Tensor>& ins,
                                        const c10d::GatherOptions& opts) override {
    std::vector<void*> dst;
    if (!outs.empty())
      for (const auto& o : outs[0]) dst.push_back(ptr(o));
    run_transport([&] {
      cpu_shm::gather(*comm_, ins[0].data_ptr(), dst.empty() ? nullptr : dst.data(), ins[0].numel(), dtype(ins[0]),
                      int(opts.rootRank));
    });
    return enqueued_work(outs.empty() ? std::vector<at::Tensor>{} : outs[0]);
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outs, std::vector<std::vector<at::Tensor>>& ins,
                                         const c10d::ScatterOptions& opts) override {
    std::vector<const void*> src;
    if (!ins.empty())
      for (const auto& i : ins[0]) src.push_back(i.const_data_ptr());
    run_transport([&] {
      cpu_shm::scatter(*comm_, src.empty() ? nullptr : src.data(), outs[0].data_ptr(), outs[0].numel(),
                       dtype(outs[0]), int(opts.rootRank));
    });
    return enqueued_work(outs);
  }

 private:
  static DType dtype(const at::Tensor& t) { return to_dtype("hierarchical step", "tensor", t.scalar_type()); }
  std::shared_ptr<cpu_shm::ShmComm> comm_;
};

}  // namespace

void ShmBackend::init_hosts(std::vector<int> hosts) {
  const int n = getSize();
  TORCH_CHECK_VALUE(int(hosts.size()) == n, "fastpar: hosts has ", hosts.size(), " entries but the group has ", n,
                    " ranks");
  std::vector<int> mine;
  for (int r = 0; r < n; ++r)
    if (hosts[size_t(r)] == hosts[size_t(getRank())]) mine.push_back(r);
  TORCH_CHECK_VALUE(mine == local_ranks_, "fastpar: hosts puts rank ", getRank(), " with ranks ", mine,
                    " but local_ranks is ", local_ranks_);
  hier_ = c10::make_intrusive<HierarchicalBackend>(getRank(), n, std::move(hosts),
                                                   c10::make_intrusive<ShmHostSteps>(comm_), leaders_, world_);
}

}  // namespace distributed
}  // namespace fastpar
