// The hierarchical schedules over c10d calls (hierarchical_engine.h): every
// step is a Work waited in order; where a step reduces in place (c10d reduce)
// and the schedule needs the input kept, a leader reduces into a copy.
#include "hierarchical_engine.h"

#include "inter_host_backend.h"

#include <ATen/core/ivalue.h>

#include <algorithm>
#include <numeric>
#include <type_traits>

namespace fastpar {
namespace distributed {

namespace {

using c10d::ReduceOp;

using carried::bytes;

bool is_avg(const ReduceOp& op) { return op.op_ == ReduceOp::AVG; }

// The reduction every step uses: AVG is a SUM divided once at the end.
ReduceOp step_op(const ReduceOp& op) { return is_avg(op) ? ReduceOp(ReduceOp::SUM) : op; }

// That division: on integers the wrapped sum truncated toward zero, as the
// kernels (reduce_ops.h finalize) and NCCL do; floating and complex sums as
// they are.
void divide_sum(at::Tensor t, int n) {
  if (at::isIntegralType(t.scalar_type(), /*includeBool=*/false)) t.div_(n, "trunc");
  else t.div_(n);
}

// Whether the hierarchical schedules serve these tensors: dense and
// contiguous (for a reduction, also one that composes: SUM, PRODUCT, MIN,
// MAX, AVG as a SUM divided once). Others go to the world backend, which
// gives their semantics or their error.
using carried::all_dense;

bool reducible(const std::vector<at::Tensor>& ts, const ReduceOp& op) {
  const auto k = op.op_;
  if (k != ReduceOp::SUM && k != ReduceOp::AVG && k != ReduceOp::PRODUCT && k != ReduceOp::MIN &&
      k != ReduceOp::MAX)
    return false;
  return all_dense(ts);
}

// The options of one step: the call's timeout, and the step's root and
// reduction.
template <class O>
O timed(std::chrono::milliseconds timeout) {
  O o;
  o.timeout = timeout;
  return o;
}
template <class O>
O rooted(int root, std::chrono::milliseconds timeout) {
  O o = timed<O>(timeout);
  o.rootRank = root;
  return o;
}
template <class O>
O reducing(const ReduceOp& op, std::chrono::milliseconds timeout, int root = 0) {
  O o = timed<O>(timeout);
  o.reduceOp = op;
  if constexpr (std::is_same_v<O, c10d::ReduceOptions>) o.rootRank = root;
  return o;
}

}  // namespace

HierarchicalEngine::HierarchicalEngine(int rank, int size, std::vector<int> host_of,
                                         c10::intrusive_ptr<c10d::Backend> local,
                                         c10::intrusive_ptr<c10d::Backend> leaders,
                                         c10::intrusive_ptr<c10d::Backend> world,
                                         c10::intrusive_ptr<c10d::Backend> columns,
                                         c10::intrusive_ptr<c10d::Store> store,
                                         std::chrono::milliseconds failure_poll)
    : Engine(rank, size),
      host_of_(std::move(host_of)),
      notice_(store && failure_poll.count() > 0 ? std::make_shared<FailureNotice>(std::move(store), failure_poll)
                                                : nullptr),
      local_(std::move(local)),
      leaders_(inter_host(std::move(leaders), rank, notice_)),
      world_(inter_host(std::move(world), rank, notice_)),
      columns_(inter_host(std::move(columns), rank, notice_)) {
  TORCH_CHECK_VALUE(int(host_of_.size()) == size, "fastpar: host_of has ", host_of_.size(),
                    " entries but the group has ", size, " ranks");
  TORCH_CHECK_VALUE(local_ && world_, "fastpar: HierarchicalEngine needs a local and a world backend");
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
  if (columns_) {
    for (size_t h = 0; h < host_ranks_.size(); ++h)
      TORCH_CHECK_VALUE(host_ranks_[h].size() == mine.size(), "fastpar: the sharded all_reduce (columns) needs the ",
                        "same number of ranks on every host, but host ", host_, " has ", mine.size(), " and host ", h,
                        " has ", host_ranks_[h].size());
    TORCH_CHECK_VALUE(columns_->getRank() == host_ && columns_->getSize() == int(host_ranks_.size()),
                      "fastpar: the columns backend is rank ", columns_->getRank(), " of ", columns_->getSize(),
                      " but this is host ", host_, " of ", host_ranks_.size());
  }
  int next = 0;
  for (const auto& rs : host_ranks_)
    for (int r : rs) hosts_contiguous_ = hosts_contiguous_ && r == next++;
}

template <class F>
auto HierarchicalEngine::across_hosts(F&& step, const char* who) -> decltype(step()) {
  // leaders_ and columns_ are InterHostBackends: every failure of their calls
  // and Works but an argument error (which leaves the group usable) arrives
  // as DistBackendError (inter_host_backend.h, between_hosts).
  try {
    return step();
  } catch (const c10::DistBackendError& e) {
    if (auto* l = dynamic_cast<Engine*>(local_.get()))
      l->abort_with(std::string(who) + " failed between hosts: " + cause(e));
    throw;
  }
}

template <class F>
c10::intrusive_ptr<c10d::Work> HierarchicalEngine::guarded(const char* op, F&& call) {
  if (!notice_) return call();
  if (auto why = notice_->known()) {
    // As the shared memory says of itself; and this host's ranks, which may
    // be waiting there for this rank, hear of it.
    if (auto* l = dynamic_cast<Engine*>(local_.get())) l->abort_with(*why);
    C10_THROW_ERROR(DistBackendError, std::string("fastpar: ") + op + " on rank " + std::to_string(getRank()) +
                                          ": the communicator is unusable after an earlier error: " + *why);
  }
  try {
    return call();
  } catch (const c10::DistBackendError& e) {
    notice_->post(cause(e));
    throw;
  }
}

c10::intrusive_ptr<c10d::Backend> HierarchicalEngine::leaders() const { return unwrapped(leaders_); }
c10::intrusive_ptr<c10d::Backend> HierarchicalEngine::world() const { return unwrapped(world_); }
c10::intrusive_ptr<c10d::Backend> HierarchicalEngine::columns() const { return unwrapped(columns_); }

void HierarchicalEngine::setTimeout(std::chrono::milliseconds timeout) {
  local_->setTimeout(timeout);
  if (leaders_) leaders_->setTimeout(timeout);
  if (columns_) columns_->setTimeout(timeout);
  world_->setTimeout(timeout);
}

HierarchicalEngine::~HierarchicalEngine() { drop_without_gil(leaders_, columns_, world_, local_); }

void HierarchicalEngine::shutdown() {
  local_->shutdown();
  if (leaders_) leaders_->shutdown();
  if (columns_) columns_->shutdown();
  world_->shutdown();
}

void HierarchicalEngine::abort() {
  local_->abort();
  if (leaders_) leaders_->abort();
  if (columns_) columns_->abort();
  world_->abort();
}

// local reduce to the leader -> leaders' allreduce -> local broadcast.
// CPU tensors of 2 MiB or more run it in pieces (at most 8, of at least
// 1 MiB), pipelined: the leaders' allreduce of piece i runs on gloo's thread
// while this thread reduces piece i + 1 inside the host, so the shared-memory
// steps hide behind the link's transfer instead of adding to it (1 Gbit/s
// links measured 0.65-0.75 of the link rate without, docs/hosts.md). Every
// rank of a host runs the same order of local steps: reduce 0, then for each
// i >= 1 reduce i and broadcast i - 1, then broadcast of the last piece.
c10::intrusive_ptr<c10d::Work> HierarchicalEngine::allreduce(std::vector<at::Tensor>& tensors,
                                                              const c10d::AllreduceOptions& opts) {
  return guarded("all_reduce", [&]() -> c10::intrusive_ptr<c10d::Work> {
    if (!reducible(tensors, opts.reduceOp)) return world_->allreduce(tensors, opts);
    at::Tensor& t = tensors[0];
    ++hier_calls_;
    constexpr int64_t kMinPiece = int64_t(1) << 20, kMaxPieces = 8;
    const int64_t bytes = t.numel() * int64_t(t.element_size());
    const int64_t pieces = t.is_cpu() ? std::min(kMaxPieces, bytes / kMinPiece) : 1;
    if (columns_) {
      if (t.numel() > 0) allreduce_sharded(t.view({-1}), opts.reduceOp, opts.timeout, std::max<int64_t>(pieces, 1));
      return enqueued_work({t});
    }
    const auto reduce_opts = reducing<c10d::ReduceOptions>(step_op(opts.reduceOp), opts.timeout);
    const auto allreduce_opts = reducing<c10d::AllreduceOptions>(step_op(opts.reduceOp), opts.timeout);
    const auto bcast_opts = rooted<c10d::BroadcastOptions>(0, opts.timeout);
    if (pieces < 2) {
      std::vector<at::Tensor> v{t};
      local_->reduce(v, reduce_opts)->wait();
      if (leads()) {
        across_hosts([&] { leaders_->allreduce(v, allreduce_opts)->wait(); });
        if (is_avg(opts.reduceOp)) divide_sum(t, getSize());
      }
      local_->broadcast(v, bcast_opts)->wait();
      return enqueued_work({t});
    }
    const at::Tensor flat = t.view({-1});
    const int64_t n = flat.numel(), per = (n + pieces - 1) / pieces;
    const auto piece = [&](int64_t i) { return flat.narrow(0, i * per, std::min(per, n - i * per)); };
    std::vector<c10::intrusive_ptr<c10d::Work>> across(pieces);
    const auto finish = [&](int64_t i) {
      std::vector<at::Tensor> v{piece(i)};
      if (leads()) {
        across_hosts([&] { across[i]->wait(); });
        across[i].reset();
        if (is_avg(opts.reduceOp)) divide_sum(v[0], getSize());
      }
      local_->broadcast(v, bcast_opts)->wait();
    };
    for (int64_t i = 0; i < pieces; ++i) {
      std::vector<at::Tensor> v{piece(i)};
      local_->reduce(v, reduce_opts)->wait();
      if (leads()) across[i] = across_hosts([&] { return leaders_->allreduce(v, allreduce_opts); });
      if (i > 0) finish(i - 1);
    }
    finish(pieces - 1);
    return enqueued_work({t});
  });
}

// The sharded schedule (hierarchical_engine.h), in the same pieces as the
// leaders' one, pipelined alike: the column all_reduce of piece i runs
// between hosts while this thread reduce-scatters piece i + 1 inside the
// host. A piece of m elements is cut into k shards of c = ceil(m / k); where
// k * c > m it goes through a scratch copy whose tail (c * k - m elements,
// fewer than k) is reduced and dropped. Every rank of a host runs the same
// order of local steps: reduce_scatter 0, then for each i >= 1
// reduce_scatter i and all_gather i - 1, then all_gather of the last piece.
void HierarchicalEngine::allreduce_sharded(const at::Tensor& flat, const ReduceOp& op,
                                            std::chrono::milliseconds timeout, int64_t pieces) {
  const int64_t n = flat.numel(), per = (n + pieces - 1) / pieces;
  const int k = local_->getSize();
  const auto rs_opts = reducing<c10d::ReduceScatterOptions>(step_op(op), timeout);
  const auto ar_opts = reducing<c10d::AllreduceOptions>(step_op(op), timeout);
  const auto ag_opts = timed<c10d::AllgatherOptions>(timeout);
  struct Piece {
    at::Tensor dst, whole, shard;  // dst: the caller's elements; whole: k shards (dst itself, or a scratch copy)
    c10::intrusive_ptr<c10d::Work> across;
  };
  std::vector<Piece> ps(pieces);
  const char* who = "this rank's column";
  const auto start = [&](int64_t i) {
    Piece& p = ps[i];
    p.dst = flat.narrow(0, i * per, std::min(per, n - i * per));
    const int64_t m = p.dst.numel(), c = (m + k - 1) / k;
    p.whole = p.dst;
    if (c * k != m) {
      p.whole = at::empty({c * k}, flat.options());
      p.whole.narrow(0, 0, m).copy_(p.dst);
      p.whole.narrow(0, m, c * k - m).zero_();
    }
    p.shard = at::empty({c}, flat.options());
    local_->_reduce_scatter_base(p.shard, p.whole, rs_opts)->wait();
    std::vector<at::Tensor> v{p.shard};
    p.across = across_hosts([&] { return columns_->allreduce(v, ar_opts); }, who);
  };
  const auto finish = [&](int64_t i) {
    Piece& p = ps[i];
    across_hosts([&] { p.across->wait(); }, who);
    p.across.reset();
    if (is_avg(op)) divide_sum(p.shard, getSize());
    local_->_allgather_base(p.whole, p.shard, ag_opts)->wait();
    if (!p.whole.is_same(p.dst)) p.dst.copy_(p.whole.narrow(0, 0, p.dst.numel()));
    p = Piece{};
  };
  for (int64_t i = 0; i < pieces; ++i) {
    start(i);
    if (i > 0) finish(i - 1);
  }
  finish(pieces - 1);
}

// Root's host: local broadcast from the root (its leader gets the data with
// the others), then the leaders' broadcast from that host; other hosts: the
// leaders' broadcast into the leader, then the local broadcast from it.
c10::intrusive_ptr<c10d::Work> HierarchicalEngine::broadcast(std::vector<at::Tensor>& tensors,
                                                              const c10d::BroadcastOptions& opts) {
  return guarded("broadcast", [&]() -> c10::intrusive_ptr<c10d::Work> {
    if (!all_dense(tensors)) return world_->broadcast(tensors, opts);
    at::Tensor& t = tensors[0];
    const int root = int(opts.rootRank), root_host = host_of_[root];
    ++hier_calls_;
    auto leaders_step = [&] {
      if (!leads()) return;
      std::vector<at::Tensor> v{t};  // crosses as its bytes (inter_host_backend.h)
      across_hosts([&] { leaders_->broadcast(v, rooted<c10d::BroadcastOptions>(root_host, opts.timeout))->wait(); });
    };
    auto local_step = [&](int local_root) {
      local_->broadcast(tensors, rooted<c10d::BroadcastOptions>(local_root, opts.timeout))->wait();
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
  });
}

// Other hosts: local reduce into a copy on the leader, which joins the
// leaders' reduce to the root's host. Root's host, root leads it: local
// reduce into the root's tensor, then the leaders' reduce on it. Root's host,
// root does not lead it: the leader's leaders' reduce runs on a copy of its
// input (gaining every other host's contribution), then a local reduce to the
// root combines it with the host's other inputs. Non-root tensors are never
// written.
c10::intrusive_ptr<c10d::Work> HierarchicalEngine::reduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::ReduceOptions& opts) {
  return guarded("reduce", [&]() -> c10::intrusive_ptr<c10d::Work> {
    if (!reducible(tensors, opts.reduceOp)) {
      // gloo's reduce leaves partial results in non-root tensors (a bitwise op's
      // too); fastpar's reduce never writes them, on one host or several.
      if (getRank() == int(opts.rootRank)) return world_->reduce(tensors, opts);
      std::vector<at::Tensor> scratch{tensors.at(0).clone()};
      return world_->reduce(scratch, opts);
    }
    at::Tensor& t = tensors[0];
    const int root = int(opts.rootRank), root_host = host_of_[root];
    const auto& mine = host_ranks_[host_];
    ++hier_calls_;
    auto leaders_step = [&](const at::Tensor& buf) {
      std::vector<at::Tensor> v{buf};
      across_hosts([&] {
        leaders_->reduce(v, reducing<c10d::ReduceOptions>(step_op(opts.reduceOp), opts.timeout, root_host))->wait();
      });
    };
    auto local_step = [&](const at::Tensor& buf, int local_root) {
      std::vector<at::Tensor> v{buf};
      local_->reduce(v, reducing<c10d::ReduceOptions>(step_op(opts.reduceOp), opts.timeout, local_root))->wait();
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
  });
}

// Local gather to the leader (straight into the host's positions of `out`);
// the leaders exchange host blocks: one all_gather when every host has the
// same number of ranks, else an all_to_all with each host's exact size; the
// leader places remote blocks at their ranks' positions when hosts
// interleave; local broadcast of the whole `out` from the leader.
void HierarchicalEngine::all_gather_bytes(const at::Tensor& in, const at::Tensor& out,
                                           std::chrono::milliseconds timeout) {
  const int64_t B = in.numel();
  const auto& mine = host_ranks_[host_];
  const int H = int(host_ranks_.size()), nl = int(mine.size());
  std::vector<at::Tensor> ins{in};
  const auto g = rooted<c10d::GatherOptions>(0, timeout);
  const auto b = rooted<c10d::BroadcastOptions>(0, timeout);
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
    across_hosts([&] { leaders_->_allgather_base(all, host_block, timed<c10d::AllgatherOptions>(timeout))->wait(); });
  } else {
    std::vector<int64_t> send(H, nl * B), recv(H);
    for (int h = 0; h < H; ++h) recv[h] = int64_t(host_ranks_[h].size()) * B;
    at::Tensor rep = host_block.repeat({H});
    across_hosts([&] { leaders_->alltoall_base(all, rep, recv, send, timed<c10d::AllToAllOptions>(timeout))->wait(); });
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

c10::intrusive_ptr<c10d::Work> HierarchicalEngine::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                              std::vector<at::Tensor>& inputs,
                                                              const c10d::AllgatherOptions& opts) {
  return guarded("all_gather", [&]() -> c10::intrusive_ptr<c10d::Work> {
    if (!all_dense(outputs[0])) return world_->allgather(outputs, inputs, opts);
    const at::Tensor& in = inputs[0];
    const int64_t B = in.numel() * int64_t(in.element_size());
    ++hier_calls_;
    at::Tensor flat = at::empty({B * getSize()}, in.options().dtype(at::kByte));
    all_gather_bytes(bytes(in), flat, opts.timeout);
    for (int q = 0; q < getSize(); ++q) bytes(outputs[0][q]).copy_(flat.narrow(0, q * B, B));
    return enqueued_work(outputs[0]);
  });
}

c10::intrusive_ptr<c10d::Work> HierarchicalEngine::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                    const c10d::AllgatherOptions& opts) {
  return guarded("all_gather_into_tensor", [&]() -> c10::intrusive_ptr<c10d::Work> {
    ++hier_calls_;
    all_gather_bytes(bytes(input), bytes(output), opts.timeout);
    return enqueued_work({output});
  });
}

// Local reduce of the whole input to the leader; the leaders' reduce_scatter
// hands each host only its ranks' blocks (host-major, every host padded to
// the largest host's rank count when hosts differ); local scatter of each
// local rank's block from the leader.
void HierarchicalEngine::reduce_scatter_flat(const at::Tensor& output, const at::Tensor& input,
                                              const c10d::ReduceOp& op, bool avg, std::chrono::milliseconds timeout) {
  const int64_t count = output.numel();
  const auto& mine = host_ranks_[host_];
  const int H = int(host_ranks_.size()), nl = int(mine.size());
  const auto r = reducing<c10d::ReduceOptions>(op, timeout);
  const auto s = rooted<c10d::ScatterOptions>(0, timeout);
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
  across_hosts([&] {
    leaders_->_reduce_scatter_base(block, host_major, reducing<c10d::ReduceScatterOptions>(op, timeout))->wait();
  });
  if (avg) divide_sum(block.narrow(0, 0, nl * count), getSize());
  std::vector<std::vector<at::Tensor>> ins(1);
  for (int l = 0; l < nl; ++l) ins[0].push_back(block.narrow(0, l * count, count));
  local_->scatter(outs, ins, s)->wait();
}

c10::intrusive_ptr<c10d::Work> HierarchicalEngine::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                         const c10d::ReduceScatterOptions& opts) {
  return guarded("reduce_scatter_tensor", [&]() -> c10::intrusive_ptr<c10d::Work> {
    if (!reducible({output}, opts.reduceOp)) return world_->_reduce_scatter_base(output, input, opts);
    ++hier_calls_;
    reduce_scatter_flat(output.view({-1}), input.view({-1}), step_op(opts.reduceOp), is_avg(opts.reduceOp),
                        opts.timeout);
    return enqueued_work({output});
  });
}

c10::intrusive_ptr<c10d::Work> HierarchicalEngine::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::GatherOptions& opts) {
  return guarded("gather", [&]() -> c10::intrusive_ptr<c10d::Work> {
    return world_->gather(outputs, inputs, opts);
  });
}

c10::intrusive_ptr<c10d::Work> HierarchicalEngine::scatter(std::vector<at::Tensor>& outputs,
                                                            std::vector<std::vector<at::Tensor>>& inputs,
                                                            const c10d::ScatterOptions& opts) {
  return guarded("scatter", [&]() -> c10::intrusive_ptr<c10d::Work> {
    return world_->scatter(outputs, inputs, opts);
  });
}

c10::intrusive_ptr<c10d::Work> HierarchicalEngine::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                  std::vector<int64_t>& output_split_sizes,
                                                                  std::vector<int64_t>& input_split_sizes,
                                                                  const c10d::AllToAllOptions& opts) {
  return guarded("all_to_all_single", [&]() -> c10::intrusive_ptr<c10d::Work> {
    return world_->alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
  });
}

c10::intrusive_ptr<c10d::Work> HierarchicalEngine::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  return guarded("send", [&]() -> c10::intrusive_ptr<c10d::Work> {
    return world_->send(tensors, dst_rank, tag);
  });
}

c10::intrusive_ptr<c10d::Work> HierarchicalEngine::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  return guarded("recv", [&]() -> c10::intrusive_ptr<c10d::Work> {
    return world_->recv(tensors, src_rank, tag);
  });
}

c10::intrusive_ptr<c10d::Work> HierarchicalEngine::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return guarded("recv", [&]() -> c10::intrusive_ptr<c10d::Work> {
    return world_->recvAnysource(tensors, tag);
  });
}

// Everyone in the host, then the hosts' leaders, then everyone in the host
// again: a rank leaves only after every rank of every host has arrived.
c10::intrusive_ptr<c10d::Work> HierarchicalEngine::barrier(const c10d::BarrierOptions& opts) {
  return guarded("barrier", [&]() -> c10::intrusive_ptr<c10d::Work> {
    local_->barrier(opts)->wait();
    if (leads()) across_hosts([&] { leaders_->barrier(opts)->wait(); });
    local_->barrier(opts)->wait();
    return enqueued_work({});
  });
}

void register_hierarchical_engine(pybind11::module& m) {
  namespace py = pybind11;
  py::module::import("torch._C._distributed_c10d");  // registers c10d::Backend with pybind first
  py::class_<HierarchicalEngine, Engine, c10::intrusive_ptr<HierarchicalEngine>>(m, "HierarchicalEngine",
                                                                                           R"(
A torch.distributed backend for ranks on several hosts, composed of `local`
(this host's ranks), `leaders` (each host's lowest rank; None elsewhere) and
`world` (every rank): all_reduce, broadcast, reduce, all_gather and
reduce_scatter (and their tensor / coalesced forms) run as local steps around
one leaders' call; everything else goes to `world`. With `columns` (the ranks
of this rank's local index on every host; hosts of equal size), all_reduce runs
sharded: local reduce_scatter, each column's all_reduce, local all_gather. fastpar.distributed builds
it for CUDA tensors on several hosts (CUDA IPC inside a host, NCCL between). With `store` (the group's)
and `failure_poll_ms` > 0, a failed call tells the group through the store, a rank waiting in gloo
between hosts looks for such a failure every `failure_poll_ms` and raises on finding one, and every
call after a failure raises at once (failure_notice.h).)")
      .def(py::init([](int rank, int size, std::vector<int> host_of, const c10::intrusive_ptr<c10d::Backend>& local,
                       std::optional<c10::intrusive_ptr<c10d::Backend>> leaders,
                       const c10::intrusive_ptr<c10d::Backend>& world,
                       std::optional<c10::intrusive_ptr<c10d::Backend>> columns,
                       std::optional<c10::intrusive_ptr<c10d::Store>> store, int64_t failure_poll_ms) {
             return c10::make_intrusive<HierarchicalEngine>(
                 rank, size, std::move(host_of), local, leaders.value_or(nullptr), world, columns.value_or(nullptr),
                 store.value_or(nullptr), std::chrono::milliseconds(failure_poll_ms));
           }),
           py::arg("rank"), py::arg("size"), py::arg("host_of"), py::arg("local"), py::arg("leaders"),
           py::arg("world"), py::arg("columns") = py::none(), py::arg("store") = py::none(),
           py::arg("failure_poll_ms") = 0)
      .def_property_readonly("local", &HierarchicalEngine::local)
      .def_property_readonly("leaders", &HierarchicalEngine::leaders)
      .def_property_readonly("world", &HierarchicalEngine::world)
      .def_property_readonly("columns", &HierarchicalEngine::columns)
      .def_property_readonly("hosts_allreduce", &HierarchicalEngine::hosts_allreduce)
      .def_property_readonly("hierarchical_calls", &HierarchicalEngine::hierarchical_calls);
}

}  // namespace distributed
}  // namespace fastpar
