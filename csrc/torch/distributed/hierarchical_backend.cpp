// The hierarchical schedules over c10d calls (hierarchical_backend.h): every
// step is a Work waited in order; where a step reduces in place (c10d reduce)
// and the schedule needs the input kept, a leader reduces into a copy.
#include "hierarchical_backend.h"

#include <ATen/core/ivalue.h>

#include <algorithm>
#include <numeric>

namespace fastpar {
namespace distributed {

namespace {

using c10d::ReduceOp;

// A contiguous tensor's bytes, as a flat uint8 view.
at::Tensor bytes_of(const at::Tensor& t) { return t.reshape({-1}).view(at::kByte); }

bool is_avg(const ReduceOp& op) { return op.op_ == ReduceOp::AVG; }

// The reduction every step uses: AVG is a SUM divided once at the end.
ReduceOp step_op(const ReduceOp& op) { return is_avg(op) ? ReduceOp(ReduceOp::SUM) : op; }

// That division: on integers the wrapped sum truncated toward zero, as the
// kernels (reduce_ops.h finalize) and NCCL do.
void divide_sum(at::Tensor t, int n) {
  if (at::isFloatingType(t.scalar_type())) t.div_(n);
  else t.div_(n, "trunc");
}

// Whether the hierarchical schedules serve this reduction of these tensors:
// dense and contiguous, a reduction that composes (SUM, PRODUCT, MIN, MAX,
// AVG as a SUM divided once). Others go to the world backend,
// which gives their semantics or their error.
bool dense(const std::vector<at::Tensor>& ts) {
  for (const auto& t : ts)
    if (!t.defined() || t.is_sparse() || !t.is_contiguous()) return false;
  return true;
}

bool reducible(const std::vector<at::Tensor>& ts, const ReduceOp& op) {
  const auto k = op.op_;
  if (k != ReduceOp::SUM && k != ReduceOp::AVG && k != ReduceOp::PRODUCT && k != ReduceOp::MIN &&
      k != ReduceOp::MAX)
    return false;
  return dense(ts);
}

}  // namespace

c10::intrusive_ptr<c10d::Work> enqueued_work(std::vector<at::Tensor> outputs) {
  std::vector<c10::Device> devices;
  if (!outputs.empty() && !outputs[0].is_cpu()) devices.push_back(outputs[0].device());
  auto fut = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
  fut->markCompleted(c10::IValue(outputs));
  return c10d::Work::create_from_future(fut);
}

HierarchicalBackend::HierarchicalBackend(int rank, int size, std::vector<int> host_of,
                                         c10::intrusive_ptr<c10d::Backend> local,
                                         c10::intrusive_ptr<c10d::Backend> leaders,
                                         c10::intrusive_ptr<c10d::Backend> world)
    : c10d::Backend(rank, size),
      host_of_(std::move(host_of)),
      local_(std::move(local)),
      leaders_(std::move(leaders)),
      world_(std::move(world)) {
  TORCH_CHECK_VALUE(int(host_of_.size()) == size, "fastpar: host_of has ", host_of_.size(),
                    " entries but the group has ", size, " ranks");
  TORCH_CHECK_VALUE(local_ && world_, "fastpar: HierarchicalBackend needs a local and a world backend");
  for (int r = 0; r < size; ++r) {
    const int h = host_of_[r];
    TORCH_CHECK_VALUE(h >= 0 && h <= int(host_ranks_.size()), "fastpar: host_of[", r, "] is ", h,
                      " but hosts must be numbered in order of their lowest rank");
    if (h == int(host_ranks_.size())) host_ranks_.emplace_back();
    host_ranks_[h].push_back(r);
  }
  host_ = host_of_[rank];
  const auto& mine = host_ranks_[host_];
  const int local_rank = int(std::find(mine.begin(), mine.end(), rank) - mine.begin());
  TORCH_CHECK_VALUE(local_->getSize() == int(mine.size()) && local_->getRank() == local_rank,
                    "fastpar: the local backend is rank ", local_->getRank(), " of ", local_->getSize(),
                    " but rank ", rank, " is rank ", local_rank, " of the ", mine.size(), " ranks of host ", host_);
  TORCH_CHECK_VALUE(bool(leaders_) == (local_rank == 0), "fastpar: rank ", rank,
                    leaders_ ? " has a leaders backend but does not lead its host"
                             : " leads its host but has no leaders backend");
  TORCH_CHECK_VALUE(!leaders_ || (leaders_->getRank() == host_ && leaders_->getSize() == int(host_ranks_.size())),
                    "fastpar: the leaders backend is rank ", leaders_ ? leaders_->getRank() : -1, " of ",
                    leaders_ ? leaders_->getSize() : -1, " but this is host ", host_, " of ", host_ranks_.size());
  TORCH_CHECK_VALUE(world_->getRank() == rank && world_->getSize() == size, "fastpar: the world backend is rank ",
                    world_->getRank(), " of ", world_->getSize(), " but this is rank ", rank, " of ", size);
  int next = 0;
  for (const auto& rs : host_ranks_)
    for (int r : rs) hosts_contiguous_ = hosts_contiguous_ && r == next++;
}

void HierarchicalBackend::setTimeout(std::chrono::milliseconds timeout) {
  local_->setTimeout(timeout);
  if (leaders_) leaders_->setTimeout(timeout);
  world_->setTimeout(timeout);
}

void HierarchicalBackend::shutdown() {
  local_->shutdown();
  if (leaders_) leaders_->shutdown();
  world_->shutdown();
}

void HierarchicalBackend::abort() {
  local_->abort();
  if (leaders_) leaders_->abort();
  world_->abort();
}

// local reduce to the leader -> leaders' allreduce -> local broadcast.
c10::intrusive_ptr<c10d::Work> HierarchicalBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                              const c10d::AllreduceOptions& opts) {
  if (tensors.size() != 1 || !reducible(tensors, opts.reduceOp)) return world_->allreduce(tensors, opts);
  at::Tensor& t = tensors[0];
  ++hier_calls_;
  std::vector<at::Tensor> v{t};
  c10d::ReduceOptions r;
  r.reduceOp = step_op(opts.reduceOp);
  r.rootRank = 0;
  r.timeout = opts.timeout;
  local_->reduce(v, r)->wait();
  if (leads()) {
    c10d::AllreduceOptions o;
    o.reduceOp = step_op(opts.reduceOp);
    o.timeout = opts.timeout;
    leaders_->allreduce(v, o)->wait();
    if (is_avg(opts.reduceOp)) divide_sum(t, getSize());
  }
  c10d::BroadcastOptions b;
  b.rootRank = 0;
  b.timeout = opts.timeout;
  local_->broadcast(v, b)->wait();
  return enqueued_work({t});
}

c10::intrusive_ptr<c10d::Work> HierarchicalBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                        const c10d::AllreduceCoalescedOptions& opts) {
  if (!reducible(tensors, opts.reduceOp)) return world_->allreduce_coalesced(tensors, opts);
  for (auto& t : tensors) {
    std::vector<at::Tensor> one{t};
    allreduce(one, opts);
  }
  return enqueued_work(tensors);
}

// Root's host: local broadcast from the root (its leader gets the data with
// the others), then the leaders' broadcast from that host; other hosts: the
// leaders' broadcast into the leader, then the local broadcast from it.
c10::intrusive_ptr<c10d::Work> HierarchicalBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                              const c10d::BroadcastOptions& opts) {
  if (tensors.size() != 1 || !dense(tensors) || opts.rootRank < 0 || opts.rootRank >= getSize())
    return world_->broadcast(tensors, opts);
  at::Tensor& t = tensors[0];
  const int root = int(opts.rootRank), root_host = host_of_[root];
  ++hier_calls_;
  auto leaders_step = [&] {
    if (!leads()) return;
    c10d::BroadcastOptions o;
    o.rootRank = root_host;
    o.timeout = opts.timeout;
    std::vector<at::Tensor> v{bytes_of(t)};
    leaders_->broadcast(v, o)->wait();
  };
  auto local_step = [&](int local_root) {
    c10d::BroadcastOptions o;
    o.rootRank = local_root;
    o.timeout = opts.timeout;
    local_->broadcast(tensors, o)->wait();
  };
  if (host_ == root_host) {
    const auto& mine = host_ranks_[host_];
    local_step(int(std::find(mine.begin(), mine.end(), root) - mine.begin()));
    leaders_step();
  } else {
    leaders_step();
    local_step(0);
  }
  return enqueued_work({t});
}

// Other hosts: local reduce into a copy on the leader, which joins the
// leaders' reduce to the root's host. Root's host, root leads it: local
// reduce into the root's tensor, then the leaders' reduce on it. Root's host,
// root does not lead it: the leader's leaders' reduce runs on a copy of its
// input (gaining every other host's contribution), then a local reduce to the
// root combines it with the host's other inputs. Non-root tensors are never
// written.
c10::intrusive_ptr<c10d::Work> HierarchicalBackend::reduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::ReduceOptions& opts) {
  if (tensors.size() != 1 || !reducible(tensors, opts.reduceOp) || opts.rootRank < 0 ||
      opts.rootRank >= getSize())
    return world_->reduce(tensors, opts);
  at::Tensor& t = tensors[0];
  const int root = int(opts.rootRank), root_host = host_of_[root];
  const auto& mine = host_ranks_[host_];
  ++hier_calls_;
  auto leaders_step = [&](const at::Tensor& buf) {
    c10d::ReduceOptions o;
    o.reduceOp = step_op(opts.reduceOp);
    o.rootRank = root_host;
    o.timeout = opts.timeout;
    std::vector<at::Tensor> v{buf};
    leaders_->reduce(v, o)->wait();
  };
  auto local_step = [&](const at::Tensor& buf, int local_root) {
    c10d::ReduceOptions o;
    o.reduceOp = step_op(opts.reduceOp);
    o.rootRank = local_root;
    o.timeout = opts.timeout;
    std::vector<at::Tensor> v{buf};
    local_->reduce(v, o)->wait();
  };
  if (host_ != root_host) {
    const at::Tensor buf = leads() ? t.clone() : t;  // only the leader's is written
    local_step(buf, 0);
    if (leads()) leaders_step(buf);
  } else if (mine[0] == root) {
    local_step(t, 0);
    if (leads()) leaders_step(t);
  } else {
    at::Tensor in = t;
    if (leads()) {
      in = t.clone();
      leaders_step(in);
    }
    local_step(in, int(std::find(mine.begin(), mine.end(), root) - mine.begin()));  // the root's `in` is t
  }
  if (is_avg(opts.reduceOp) && getRank() == root) divide_sum(t, getSize());
  return enqueued_work({t});
}

// Local gather to the leader (straight into the host's positions of `out`);
// the leaders exchange host blocks: one all_gather when every host has the
// same number of ranks, else an all_to_all with each host's exact size; the
// leader places remote blocks at their ranks' positions when hosts
// interleave; local broadcast of the whole `out` from the leader.
void HierarchicalBackend::all_gather_bytes(const at::Tensor& in, const at::Tensor& out,
                                           std::chrono::milliseconds timeout) {
  const int64_t B = in.numel();
  const auto& mine = host_ranks_[host_];
  const int H = int(host_ranks_.size()), nl = int(mine.size());
  std::vector<at::Tensor> ins{in};
  c10d::GatherOptions g;
  g.rootRank = 0;
  g.timeout = timeout;
  c10d::BroadcastOptions b;
  b.rootRank = 0;
  b.timeout = timeout;
  std::vector<at::Tensor> whole{out};
  if (!leads()) {
    std::vector<std::vector<at::Tensor>> none;
    local_->gather(none, ins, g)->wait();
    local_->broadcast(whole, b)->wait();
    return;
  }
  std::vector<std::vector<at::Tensor>> outs(1);
  for (int l = 0; l < nl; ++l) outs[0].push_back(out.narrow(0, mine[l] * B, B));
  local_->gather(outs, ins, g)->wait();
  // This host's blocks, contiguous in local rank order; a copy, because the
  // leaders' step must not read what it writes.
  at::Tensor host_block = hosts_contiguous_ ? out.narrow(0, mine[0] * B, nl * B).clone() : at::cat(outs[0]);
  bool even = true;
  for (const auto& rs : host_ranks_) even = even && rs.size() == size_t(nl);
  at::Tensor all = hosts_contiguous_ ? out : at::empty_like(out);  // host-major
  if (even) {
    c10d::AllgatherOptions o;
    o.timeout = timeout;
    leaders_->_allgather_base(all, host_block, o)->wait();
  } else {
    std::vector<int64_t> send(H, nl * B), recv(H);
    for (int h = 0; h < H; ++h) recv[h] = int64_t(host_ranks_[h].size()) * B;
    at::Tensor rep = host_block.repeat({H});
    c10d::AllToAllOptions o;
    o.timeout = timeout;
    leaders_->alltoall_base(all, rep, recv, send, o)->wait();
  }
  if (!hosts_contiguous_) {
    int64_t off = 0;
    for (const auto& rs : host_ranks_)
      for (int r : rs) {
        if (host_of_[r] != host_) out.narrow(0, r * B, B).copy_(all.narrow(0, off, B));
        off += B;
      }
  }
  local_->broadcast(whole, b)->wait();
}

c10::intrusive_ptr<c10d::Work> HierarchicalBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                              std::vector<at::Tensor>& inputs,
                                                              const c10d::AllgatherOptions& opts) {
  if (inputs.size() != 1 || outputs.size() != 1 || int(outputs[0].size()) != getSize() || !dense(inputs) ||
      !dense(outputs[0]))
    return world_->allgather(outputs, inputs, opts);
  const at::Tensor& in = inputs[0];
  for (const auto& o : outputs[0])
    if (o.numel() != in.numel() || o.scalar_type() != in.scalar_type())
      return world_->allgather(outputs, inputs, opts);
  const int64_t B = in.numel() * int64_t(in.element_size());
  ++hier_calls_;
  at::Tensor flat = at::empty({B * getSize()}, in.options().dtype(at::kByte));
  all_gather_bytes(bytes_of(in), flat, opts.timeout);
  for (int q = 0; q < getSize(); ++q) bytes_of(outputs[0][q]).copy_(flat.narrow(0, q * B, B));
  return enqueued_work(outputs[0]);
}

c10::intrusive_ptr<c10d::Work> HierarchicalBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                    const c10d::AllgatherOptions& opts) {
  if (!dense({output, input}) || output.numel() != input.numel() * getSize() ||
      output.scalar_type() != input.scalar_type())
    return world_->_allgather_base(output, input, opts);
  ++hier_calls_;
  all_gather_bytes(bytes_of(input), bytes_of(output), opts.timeout);
  return enqueued_work({output});
}

c10::intrusive_ptr<c10d::Work> HierarchicalBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return world_->allgather_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> HierarchicalBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  bool ok = outputs.size() == inputs.size() && dense(outputs) && dense(inputs);
  for (size_t i = 0; ok && i < inputs.size(); ++i)
    ok = outputs[i].numel() == inputs[i].numel() * getSize() && outputs[i].scalar_type() == inputs[i].scalar_type();
  if (!ok) return world_->allgather_into_tensor_coalesced(outputs, inputs, opts);
  for (size_t i = 0; i < inputs.size(); ++i) {
    ++hier_calls_;
    all_gather_bytes(bytes_of(inputs[i]), bytes_of(outputs[i]), opts.timeout);
  }
  return enqueued_work(outputs);
}

// Local reduce of the whole input to the leader; the leaders' reduce_scatter
// hands each host only its ranks' blocks (host-major, every host padded to
// the largest host's rank count when hosts differ); local scatter of each
// local rank's block from the leader.
void HierarchicalBackend::reduce_scatter_flat(const at::Tensor& output, const at::Tensor& input,
                                              const c10d::ReduceOp& op, bool avg, std::chrono::milliseconds timeout) {
  const int64_t count = output.numel();
  const auto& mine = host_ranks_[host_];
  const int H = int(host_ranks_.size()), nl = int(mine.size());
  c10d::ReduceOptions r;
  r.reduceOp = op;
  r.rootRank = 0;
  r.timeout = timeout;
  c10d::ScatterOptions s;
  s.rootRank = 0;
  s.timeout = timeout;
  std::vector<at::Tensor> outs{output};
  if (!leads()) {
    std::vector<at::Tensor> v{input};  // read, not written: this rank is not the local root
    local_->reduce(v, r)->wait();
    std::vector<std::vector<at::Tensor>> none;
    local_->scatter(outs, none, s)->wait();
    return;
  }
  at::Tensor host_sum = input.clone();
  std::vector<at::Tensor> v{host_sum};
  local_->reduce(v, r)->wait();
  size_t most = 0;
  for (const auto& rs : host_ranks_) most = std::max(most, rs.size());
  const int64_t per_host = int64_t(most) * count;
  at::Tensor host_major = host_sum;
  if (!hosts_contiguous_ || most * H != size_t(getSize())) {
    host_major = at::zeros({H * per_host}, output.options());
    for (int h = 0; h < H; ++h)
      for (size_t i = 0; i < host_ranks_[h].size(); ++i)
        host_major.narrow(0, h * per_host + int64_t(i) * count, count)
            .copy_(host_sum.narrow(0, host_ranks_[h][i] * count, count));
  }
  at::Tensor block = at::empty({per_host}, output.options());
  c10d::ReduceScatterOptions o;
  o.reduceOp = op;
  o.timeout = timeout;
  leaders_->_reduce_scatter_base(block, host_major, o)->wait();
  if (avg) divide_sum(block.narrow(0, 0, nl * count), getSize());
  std::vector<std::vector<at::Tensor>> ins(1);
  for (int l = 0; l < nl; ++l) ins[0].push_back(block.narrow(0, l * count, count));
  local_->scatter(outs, ins, s)->wait();
}

c10::intrusive_ptr<c10d::Work> HierarchicalBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                         const c10d::ReduceScatterOptions& opts) {
  if (!reducible({output, input}, opts.reduceOp) || input.numel() != output.numel() * getSize() ||
      output.scalar_type() != input.scalar_type())
    return world_->_reduce_scatter_base(output, input, opts);
  ++hier_calls_;
  reduce_scatter_flat(output.view({-1}), input.view({-1}), step_op(opts.reduceOp), is_avg(opts.reduceOp),
                      opts.timeout);
  return enqueued_work({output});
}

c10::intrusive_ptr<c10d::Work> HierarchicalBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                   std::vector<std::vector<at::Tensor>>& inputs,
                                                                   const c10d::ReduceScatterOptions& opts) {
  bool ok = outputs.size() == 1 && inputs.size() == 1 && int(inputs[0].size()) == getSize() &&
            reducible(outputs, opts.reduceOp) && reducible(inputs[0], opts.reduceOp);
  for (size_t q = 0; ok && q < inputs[0].size(); ++q)
    ok = inputs[0][q].numel() == outputs[0].numel() && inputs[0][q].scalar_type() == outputs[0].scalar_type();
  if (!ok) return world_->reduce_scatter(outputs, inputs, opts);
  ++hier_calls_;
  std::vector<at::Tensor> flat;
  for (const auto& t : inputs[0]) flat.push_back(t.reshape({-1}));
  reduce_scatter_flat(outputs[0].view({-1}), at::cat(flat), step_op(opts.reduceOp), is_avg(opts.reduceOp),
                      opts.timeout);
  return enqueued_work(outputs);
}

c10::intrusive_ptr<c10d::Work> HierarchicalBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  bool ok = outputs.size() == inputs.size() && reducible(outputs, opts.reduceOp) && reducible(inputs, opts.reduceOp);
  for (size_t i = 0; ok && i < inputs.size(); ++i)
    ok = inputs[i].numel() == outputs[i].numel() * getSize() && inputs[i].scalar_type() == outputs[i].scalar_type();
  if (!ok) return world_->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
  for (size_t i = 0; i < inputs.size(); ++i) {
    ++hier_calls_;
    reduce_scatter_flat(outputs[i].view({-1}), inputs[i].view({-1}), step_op(opts.reduceOp), is_avg(opts.reduceOp),
                        opts.timeout);
  }
  return enqueued_work(outputs);
}

c10::intrusive_ptr<c10d::Work> HierarchicalBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::GatherOptions& opts) {
  return world_->gather(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> HierarchicalBackend::scatter(std::vector<at::Tensor>& outputs,
                                                            std::vector<std::vector<at::Tensor>>& inputs,
                                                            const c10d::ScatterOptions& opts) {
  return world_->scatter(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> HierarchicalBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                  std::vector<int64_t>& output_split_sizes,
                                                                  std::vector<int64_t>& input_split_sizes,
                                                                  const c10d::AllToAllOptions& opts) {
  return world_->alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
}

// The list form as the world's alltoall_base over packed copies: gloo has the
// list form only since torch 2.12 (the GPU machine's 2.11 lacks it), while
// every world backend has alltoall_base. Lists it cannot pack go to the world
// backend, which gives their semantics or their error.
c10::intrusive_ptr<c10d::Work> HierarchicalBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllToAllOptions& opts) {
  if (int(inputs.size()) != getSize() || int(outputs.size()) != getSize() || !dense(inputs) || !dense(outputs))
    return world_->alltoall(outputs, inputs, opts);
  std::vector<int64_t> send, recv;
  for (int r = 0; r < getSize(); ++r) {
    if (inputs[r].scalar_type() != inputs[0].scalar_type() || outputs[r].scalar_type() != inputs[0].scalar_type())
      return world_->alltoall(outputs, inputs, opts);
    send.push_back(inputs[r].numel());
    recv.push_back(outputs[r].numel());
  }
  std::vector<at::Tensor> flat_in;
  for (const auto& t : inputs) flat_in.push_back(t.reshape({-1}));
  at::Tensor packed_in = at::cat(flat_in);
  at::Tensor packed_out = at::empty({std::accumulate(recv.begin(), recv.end(), int64_t(0))}, packed_in.options());
  // copies: gloo leaves the split vectors it is given moved-from (a segfault here with torch 2.11)
  std::vector<int64_t> recv_arg = recv, send_arg = send;
  world_->alltoall_base(packed_out, packed_in, recv_arg, send_arg, opts)->wait();
  int64_t off = 0;
  for (int r = 0; r < getSize(); ++r) {
    outputs[r].view({-1}).copy_(packed_out.narrow(0, off, recv[r]));
    off += recv[r];
  }
  return enqueued_work(outputs);
}

c10::intrusive_ptr<c10d::Work> HierarchicalBackend::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  return world_->send(tensors, dst_rank, tag);
}

c10::intrusive_ptr<c10d::Work> HierarchicalBackend::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  return world_->recv(tensors, src_rank, tag);
}

c10::intrusive_ptr<c10d::Work> HierarchicalBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return world_->recvAnysource(tensors, tag);
}

c10::intrusive_ptr<c10d::Work> HierarchicalBackend::barrier(const c10d::BarrierOptions& opts) {
  return world_->barrier(opts);
}

void register_hierarchical_backend(pybind11::module& m) {
  namespace py = pybind11;
  py::module::import("torch._C._distributed_c10d");  // registers c10d::Backend with pybind first
  py::class_<HierarchicalBackend, c10d::Backend, c10::intrusive_ptr<HierarchicalBackend>>(m, "HierarchicalBackend",
                                                                                           R"(
A torch.distributed backend for ranks on several hosts, composed of `local`
(this host's ranks), `leaders` (each host's lowest rank; None elsewhere) and
`world` (every rank): all_reduce, broadcast, reduce, all_gather and
reduce_scatter (and their tensor / coalesced forms) run as local steps around
one leaders' call; everything else goes to `world`. fastpar.distributed builds
it for CUDA tensors on several hosts (CUDA IPC inside a host, NCCL between).)")
      .def(py::init([](int rank, int size, std::vector<int> host_of, const c10::intrusive_ptr<c10d::Backend>& local,
                       std::optional<c10::intrusive_ptr<c10d::Backend>> leaders,
                       const c10::intrusive_ptr<c10d::Backend>& world) {
             return c10::make_intrusive<HierarchicalBackend>(rank, size, std::move(host_of), local,
                                                             leaders.value_or(nullptr), world);
           }),
           py::arg("rank"), py::arg("size"), py::arg("host_of"), py::arg("local"), py::arg("leaders"),
           py::arg("world"))
      .def_property_readonly("local", &HierarchicalBackend::local)
      .def_property_readonly("leaders", &HierarchicalBackend::leaders)
      .def_property_readonly("world", &HierarchicalBackend::world)
      .def_property_readonly("hierarchical_calls", &HierarchicalBackend::hierarchical_calls);
}

}  // namespace distributed
}  // namespace fastpar
