// Hierarchical schedules of the fastpar c10d backend, used when a group's
// ranks span several hosts: the cpu_shm transport inside each host (local
// rank 0, the lowest group rank of the host, is its leader) and one call on
// the gloo group of the leaders between hosts. Each schedule sends every
// host's data over the leaders' group once; docs/algorithms.md lists the steps
// and the bytes each rank moves.
//
// Hosts are numbered in order of their lowest rank, so host h's leader is rank
// h of `leaders_`. A host's ranks need not be contiguous in group rank (hosts
// may interleave) and hosts may hold different numbers of ranks.
//
// Reductions: AVG runs as SUM and is divided once by the group size, where the
// final value is formed (as allreduce does). Copies over gloo travel as bytes
// (a uint8 view), so every fastpar dtype goes through whatever gloo supports.
#include <algorithm>
#include <cstring>

#include "call_timeout.h"
#include "../ops/checks.h"
#include "shm_backend.h"
#include "../ops/transport_errors.h"

namespace fastpar {
namespace ops {

namespace {

// A contiguous tensor's bytes, as a flat uint8 view.
at::Tensor bytes_of(const at::Tensor& t) { return t.reshape({-1}).view(at::kByte); }

char* ptr(const at::Tensor& t, int64_t byte_offset = 0) { return static_cast<char*>(t.data_ptr()) + byte_offset; }

ReduceOp local_op(ReduceOp op) { return op == ReduceOp::AVG ? ReduceOp::SUM : op; }

c10d::ReduceOp wire_op(ReduceOp op, const c10d::ReduceOp& given) {
  return op == ReduceOp::AVG ? c10d::ReduceOp(c10d::ReduceOp::SUM) : given;
}

}  // namespace

void ShmBackend::init_hosts(std::vector<int> hosts) {
  const int n = getSize();
  TORCH_CHECK_VALUE(int(hosts.size()) == n, "fastpar: hosts has ", hosts.size(), " entries but the group has ", n,
                    " ranks");
  host_of_ = std::move(hosts);
  for (int r = 0; r < n; ++r) {
    const int h = host_of_[r];
    TORCH_CHECK_VALUE(h >= 0 && h <= int(host_ranks_.size()), "fastpar: hosts[", r, "] is ", h,
                      " but hosts must be numbered in order of their lowest rank");
    if (h == int(host_ranks_.size())) host_ranks_.emplace_back();
    host_ranks_[h].push_back(r);
  }
  host_ = host_of_[getRank()];
  TORCH_CHECK_VALUE(host_ranks_[host_] == local_ranks_, "fastpar: hosts puts rank ", getRank(), " with ranks ",
                    host_ranks_[host_], " but local_ranks is ", local_ranks_);
  TORCH_CHECK_VALUE(bool(leaders_) == (comm_->rank() == 0), "fastpar: rank ", getRank(),
                    leaders_ ? " has a leaders group but is not its host's lowest rank"
                             : " leads its host but has no leaders group");
  TORCH_CHECK_VALUE(!leaders_ || (leaders_->getRank() == host_ && leaders_->getSize() == int(host_ranks_.size())),
                    "fastpar: the leaders group has rank ", leaders_ ? leaders_->getRank() : -1, " of ",
                    leaders_ ? leaders_->getSize() : -1, " but this is host ", host_, " of ", host_ranks_.size());
  int next = 0;
  for (const auto& rs : host_ranks_)
    for (int r : rs) hosts_contiguous_ = hosts_contiguous_ && r == next++;
}

// shm reduce to the leader -> gloo allreduce among leaders -> shm broadcast.
c10::intrusive_ptr<c10d::Work> ShmBackend::hier_allreduce(at::Tensor& t, DType dt, ReduceOp op,
                                                          const c10d::AllreduceOptions& opts) {
  auto g = start(opts.timeout);
  ++hier_calls_;
  run_transport([&] { cpu_shm::reduce(*comm_, t.data_ptr(), t.data_ptr(), t.numel(), dt, local_op(op), 0); });
  if (leaders_) {
    c10d::AllreduceOptions o;
    o.reduceOp = wire_op(op, opts.reduceOp);
    o.timeout = call_timeout(opts.timeout, timeout_);
    std::vector<at::Tensor> v{t};
    leaders_->allreduce(v, o)->wait();
    if (op == ReduceOp::AVG) t.div_(getSize());
  }
  run_transport([&] { cpu_shm::broadcast(*comm_, t.data_ptr(), t.numel(), dt, 0); });
  return done(c10d::OpType::ALLREDUCE, {t});
}

// Root's host: shm broadcast from the root (its leader gets the data with the
// others), then the leaders' gloo broadcast from that host; the other hosts:
// gloo broadcast into the leader, then shm broadcast from it.

c10::intrusive_ptr<c10d::Work> ShmBackend::hier_broadcast(std::vector<at::Tensor>& tensors, DType dt,
                                                          const c10d::BroadcastOptions& opts) {
  at::Tensor& t = tensors[0];
  const int root = int(opts.rootRank), root_host = host_of_[root];
  auto g = start(opts.timeout);
  ++hier_calls_;
  auto leaders_step = [&] {
    if (!leaders_) return;
    c10d::BroadcastOptions o;
    o.rootRank = root_host;
    o.timeout = call_timeout(opts.timeout, timeout_);
    std::vector<at::Tensor> v{bytes_of(t)};
    leaders_->broadcast(v, o)->wait();
  };
  if (host_ == root_host) {
    const int local = int(std::find(local_ranks_.begin(), local_ranks_.end(), root) - local_ranks_.begin());
    run_transport([&] { cpu_shm::broadcast(*comm_, t.data_ptr(), t.numel(), dt, local); });
    leaders_step();
  } else {
    leaders_step();
    run_transport([&] { cpu_shm::broadcast(*comm_, t.data_ptr(), t.numel(), dt, 0); });
  }
  return done(c10d::OpType::BROADCAST, tensors);
}

// Other hosts: shm reduce into a temporary on the leader, which joins the
// leaders' gloo reduce to the root's host. Root's host, root is the leader:
// shm reduce into the root's tensor, then the gloo reduce on it. Root's host,
// root is not the leader: the leader's gloo reduce runs on a copy of its input
// (gaining every other host's contribution), then an shm reduce to the root
// combines it with the host's other inputs. Non-root tensors are not written
// (gloo would leave partial results in them; fastpar's single-host reduce,
// like NCCL's, leaves them alone, and so does this).
c10::intrusive_ptr<c10d::Work> ShmBackend::hier_reduce(std::vector<at::Tensor>& tensors, DType dt, ReduceOp op,
                                                       const c10d::ReduceOptions& opts) {
  at::Tensor& t = tensors[0];
  const int root = int(opts.rootRank), root_host = host_of_[root];
  const ReduceOp lop = local_op(op);
  auto g = start(opts.timeout);
  ++hier_calls_;
  auto leaders_step = [&](at::Tensor& buf) {
    c10d::ReduceOptions o;
    o.reduceOp = wire_op(op, opts.reduceOp);
    o.rootRank = root_host;
    o.timeout = call_timeout(opts.timeout, timeout_);
    std::vector<at::Tensor> v{buf};
    leaders_->reduce(v, o)->wait();
  };
  if (host_ != root_host) {
    at::Tensor partial = leaders_ ? at::empty_like(t) : t;  // only the leader's is written
    run_transport([&] { cpu_shm::reduce(*comm_, t.data_ptr(), partial.data_ptr(), t.numel(), dt, lop, 0); });
    if (leaders_) leaders_step(partial);
  } else if (local_ranks_[0] == root) {
    run_transport([&] { cpu_shm::reduce(*comm_, t.data_ptr(), t.data_ptr(), t.numel(), dt, lop, 0); });
    if (leaders_) leaders_step(t);
  } else {
    at::Tensor in = t;
    if (leaders_) {
      in = t.clone();
      leaders_step(in);
    }
    const int local = int(std::find(local_ranks_.begin(), local_ranks_.end(), root) - local_ranks_.begin());
    run_transport([&] { cpu_shm::reduce(*comm_, in.data_ptr(), t.data_ptr(), t.numel(), dt, lop, local); });
  }
  if (op == ReduceOp::AVG && getRank() == root) t.div_(getSize());
  return done(c10d::OpType::REDUCE, tensors);
}

// shm gather to the leader (straight into the host's positions of `out`);
// leaders exchange host blocks over gloo: one allgather when every host has
// the same number of ranks, else an all_to_all with exact per-host sizes (no
// padding on the wire); the leader places remote blocks at their ranks'
// positions; shm broadcast of the whole `out` from the leader.
void ShmBackend::hier_allgather_bytes(const at::Tensor& in, const at::Tensor& out, DType dt,
                                      std::chrono::milliseconds t) {
  // Local steps count elements of dt (so peers' descriptors are checked as in
  // any fastpar call); offsets and the gloo step are in bytes.
  const int64_t B = in.numel(), count = B / dtype_size(dt);
  const int H = int(host_ranks_.size()), nl = int(local_ranks_.size());
  if (!leaders_) {
    run_transport([&] { cpu_shm::gather(*comm_, in.data_ptr(), nullptr, count, dt, 0); });
    run_transport([&] { cpu_shm::broadcast(*comm_, out.data_ptr(), count * getSize(), dt, 0); });
    return;
  }
  std::vector<void*> outs(nl);
  for (int l = 0; l < nl; ++l) outs[l] = ptr(out, local_ranks_[l] * B);
  run_transport([&] { cpu_shm::gather(*comm_, in.data_ptr(), outs.data(), count, dt, 0); });
  // This host's block, contiguous in local rank order.
  at::Tensor mine;
  if (hosts_contiguous_) {
    mine = out.narrow(0, local_ranks_[0] * B, nl * B).clone();  // gloo must not read what it writes
  } else {
    mine = at::empty({nl * B}, out.options());
    for (int l = 0; l < nl; ++l) std::memcpy(ptr(mine, l * B), outs[l], size_t(B));
  }
  bool even = true;
  for (const auto& rs : host_ranks_) even = even && rs.size() == size_t(nl);
  // Host-major: host 0's ranks, then host 1's, ... (group rank order when contiguous).
  at::Tensor all = hosts_contiguous_ ? out : at::empty_like(out);
  if (even) {
    c10d::AllgatherOptions o;
    o.timeout = t;
    leaders_->_allgather_base(all, mine, o)->wait();
  } else {
    std::vector<int64_t> send(H, nl * B), recv(H);
    for (int h = 0; h < H; ++h) recv[h] = int64_t(host_ranks_[h].size()) * B;
    at::Tensor rep = mine.repeat({H});
    c10d::AllToAllOptions o;
    o.timeout = t;
    leaders_->alltoall_base(all, rep, recv, send, o)->wait();
  }
  if (!hosts_contiguous_) {
    int64_t off = 0;
    for (const auto& rs : host_ranks_)
      for (int r : rs) {
        if (host_of_[r] != host_) std::memcpy(ptr(out, r * B), ptr(all, off), size_t(B));
        off += B;
      }
  }
  run_transport([&] { cpu_shm::broadcast(*comm_, out.data_ptr(), count * getSize(), dt, 0); });
}

c10::intrusive_ptr<c10d::Work> ShmBackend::hier_allgather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                                                          DType dt, const c10d::AllgatherOptions& opts) {
  const int64_t B = input.numel() * int64_t(input.element_size());
  at::Tensor flat = at::empty({B * getSize()}, input.options().dtype(at::kByte));
  {
    auto g = start(opts.timeout);
    ++hier_calls_;
    hier_allgather_bytes(bytes_of(input), flat, dt, call_timeout(opts.timeout, timeout_));
  }
  for (int q = 0; q < getSize(); ++q)
    if (B) std::memcpy(outputs[q].data_ptr(), ptr(flat, q * B), size_t(B));
  return done(c10d::OpType::ALLGATHER, outputs);
}

c10::intrusive_ptr<c10d::Work> ShmBackend::hier_allgather_base(at::Tensor& output, const at::Tensor& input,
                                                               DType dt, const c10d::AllgatherOptions& opts) {
  auto g = start(opts.timeout);
  ++hier_calls_;
  hier_allgather_bytes(bytes_of(input), bytes_of(output), dt, call_timeout(opts.timeout, timeout_));
  return done(c10d::OpType::_ALLGATHER_BASE, {output});
}

// shm reduce of the whole input to the leader; the leaders' gloo
// reduce_scatter hands each host only its ranks' blocks (host-major, every
// host padded to the largest host's rank count when hosts differ); shm
// scatter of each local rank's block from the leader.
c10::intrusive_ptr<c10d::Work> ShmBackend::hier_reduce_scatter_base(at::Tensor& output, const at::Tensor& input,
                                                                    DType dt, ReduceOp op,
                                                                    const c10d::ReduceScatterOptions& opts) {
  const int64_t count = output.numel();
  const int H = int(host_ranks_.size()), nl = int(local_ranks_.size());
  auto g = start(opts.timeout);
  ++hier_calls_;
  if (!leaders_) {
    run_transport([&] { cpu_shm::reduce(*comm_, input.data_ptr(), nullptr, input.numel(), dt, local_op(op), 0); });
    run_transport([&] { cpu_shm::scatter(*comm_, nullptr, output.data_ptr(), count, dt, 0); });
    return done(c10d::OpType::_REDUCE_SCATTER_BASE, {output});
  }
  at::Tensor host_sum = at::empty({input.numel()}, output.options());
  run_transport([&] {
    cpu_shm::reduce(*comm_, input.data_ptr(), host_sum.data_ptr(), input.numel(), dt, local_op(op), 0);
  });
  size_t most = 0;
  for (const auto& rs : host_ranks_) most = std::max(most, rs.size());
  const int64_t per_host = int64_t(most) * count, es = int64_t(output.element_size());
  at::Tensor host_major = host_sum;
  if (!hosts_contiguous_ || most * H != size_t(getSize())) {
    host_major = at::zeros({H * per_host}, output.options());
    for (int h = 0; h < H; ++h)
      for (size_t i = 0; i < host_ranks_[h].size(); ++i)
        std::memcpy(ptr(host_major, (h * per_host + int64_t(i) * count) * es),
                    ptr(host_sum, host_ranks_[h][i] * count * es), size_t(count * es));
  }
  at::Tensor mine = at::empty({per_host}, output.options());
  c10d::ReduceScatterOptions o;
  o.reduceOp = wire_op(op, opts.reduceOp);
  o.timeout = call_timeout(opts.timeout, timeout_);
  leaders_->_reduce_scatter_base(mine, host_major, o)->wait();
  if (op == ReduceOp::AVG) mine.narrow(0, 0, nl * count).div_(getSize());
  std::vector<const void*> ins(nl);
  for (int l = 0; l < nl; ++l) ins[l] = ptr(mine, l * count * es);
  run_transport([&] { cpu_shm::scatter(*comm_, ins.data(), output.data_ptr(), count, dt, 0); });
  return done(c10d::OpType::_REDUCE_SCATTER_BASE, {output});
}

}  // namespace ops
}  // namespace fastpar
