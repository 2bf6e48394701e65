// The hierarchical schedules over c10d calls (hierarchical_engine.h): every
// step is a Work waited in order; where a step reduces in place (c10d reduce)
// and the schedule needs the input kept, a leader reduces into a copy.
#include "hierarchical_engine.h"


#include <ATen/core/ivalue.h>

#include <algorithm>
#include <numeric>
#include <type_traits>

#include "bindings.h"

namespace fastpar {
namespace distributed {

namespace {

using carried::bytes;

bool is_avg(ReduceOp op) { return op == ReduceOp::AVG; }

// The reduction every step uses: AVG is a SUM divided once at the end.
ReduceOp step_op(ReduceOp op) { return is_avg(op) ? ReduceOp::SUM : op; }

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

bool reducible(const std::vector<at::Tensor>& ts, const Call& c) {
  const ReduceOp k = c.op;
  if (c.foreign || (k != ReduceOp::SUM && k != ReduceOp::AVG && k != ReduceOp::PRODUCT && k != ReduceOp::MIN &&
                    k != ReduceOp::MAX))
    return false;
  return all_dense(ts);
}

// The call of one step: the caller's timeout, the step's root and reduction.
Call timed(std::chrono::milliseconds timeout) { return Call::rooted(0, timeout); }
Call rooted(int root, std::chrono::milliseconds timeout) { return Call::rooted(root, timeout); }
Call reducing(ReduceOp op, std::chrono::milliseconds timeout, int root = 0) {
  return Call::reducing(op, timeout, root);
}

}  // namespace

HierarchicalEngine::HierarchicalEngine(int rank, int size, std::vector<int> host_of,
                                       c10::intrusive_ptr<Engine> local, c10::intrusive_ptr<c10d::Backend> leaders,
                                       c10::intrusive_ptr<c10d::Backend> world,
                                       c10::intrusive_ptr<c10d::Backend> columns,
                                       c10::intrusive_ptr<c10d::Store> store, std::chrono::milliseconds failure_poll)
    : Engine(rank, size),
      host_of_(std::move(host_of)),
      notice_(store && failure_poll.count() > 0 ? std::make_shared<FailureNotice>(std::move(store), failure_poll)
                                                : nullptr),
      local_(std::move(local)),
      leaders_(c10d_engine(std::move(leaders), rank, /*between_hosts=*/true, notice_)),
      world_(c10d_engine(std::move(world), rank, /*between_hosts=*/true, notice_)),
      columns_(c10d_engine(std::move(columns), rank, /*between_hosts=*/true, notice_)) {
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
  TORCH_CHECK_VALUE(local_->size() == int(mine.size()) && local_->rank() == local_rank,
                    "fastpar: the local backend is rank ", local_->rank(), " of ", local_->size(),
                    " but rank ", rank, " is rank ", local_rank, " of the ", mine.size(), " ranks of host ", host_);
  TORCH_CHECK_VALUE(bool(leaders_) == (local_rank == 0), "fastpar: rank ", rank,
                    leaders_ ? " has a leaders backend but does not lead its host"
                             : " leads its host but has no leaders backend");
  TORCH_CHECK_VALUE(!leaders_ || (leaders_->rank() == host_ && leaders_->size() == int(host_ranks_.size())),
                    "fastpar: the leaders backend is rank ", leaders_ ? leaders_->rank() : -1, " of ",
                    leaders_ ? leaders_->size() : -1, " but this is host ", host_, " of ", host_ranks_.size());
  TORCH_CHECK_VALUE(world_->rank() == rank && world_->size() == size, "fastpar: the world backend is rank ",
                    world_->rank(), " of ", world_->size(), " but this is rank ", rank, " of ", size);
  if (columns_) {
    for (size_t h = 0; h < host_ranks_.size(); ++h)
      TORCH_CHECK_VALUE(host_ranks_[h].size() == mine.size(), "fastpar: the sharded all_reduce (columns) needs the ",
                        "same number of ranks on every host, but host ", host_, " has ", mine.size(), " and host ", h,
                        " has ", host_ranks_[h].size());
    TORCH_CHECK_VALUE(columns_->rank() == host_ && columns_->size() == int(host_ranks_.size()),
                      "fastpar: the columns backend is rank ", columns_->rank(), " of ", columns_->size(),
                      " but this is host ", host_, " of ", host_ranks_.size());
  }
  int next = 0;
  for (const auto& rs : host_ranks_)
    for (int r : rs) hosts_contiguous_ = hosts_contiguous_ && r == next++;
}

template <class F>
auto HierarchicalEngine::across_hosts(F&& step, const char* who) -> decltype(step()) {
  // leaders_ and columns_ are C10dEngines between hosts: every failure of
  // their calls and Works but an argument error (which leaves the group
  // usable) arrives as DistBackendError (c10d_engine.h, between_hosts).
  try {
    return step();
  } catch (const c10::DistBackendError& e) {
    local_->abort_with(std::string(who) + " failed between hosts: " + cause(e));
    throw;
  }
}

template <class F>
Work HierarchicalEngine::guarded(const char* op, F&& call) {
  if (!notice_) return call();
  if (auto why = notice_->known()) {
    // As the shared memory says of itself; and this host's ranks, which may
    // be waiting there for this rank, hear of it.
    local_->abort_with(*why);
    C10_THROW_ERROR(DistBackendError, std::string("fastpar: ") + op + " on rank " + std::to_string(rank()) +
                                          ": the communicator is unusable after an earlier error: " + *why);
  }
  try {
    return call();
  } catch (const c10::DistBackendError& e) {
    notice_->post(cause(e));
    throw;
  }
}

namespace {
c10::intrusive_ptr<c10d::Backend> inner_of(const c10::intrusive_ptr<C10dEngine>& e) {
  return e ? e->inner() : nullptr;
}
}  // namespace

c10::intrusive_ptr<c10d::Backend> HierarchicalEngine::leaders() const { return inner_of(leaders_); }
c10::intrusive_ptr<c10d::Backend> HierarchicalEngine::world() const { return inner_of(world_); }
c10::intrusive_ptr<c10d::Backend> HierarchicalEngine::columns() const { return inner_of(columns_); }

void HierarchicalEngine::set_timeout(std::chrono::milliseconds timeout) {
  local_->set_timeout(timeout);
  if (leaders_) leaders_->set_timeout(timeout);
  if (columns_) columns_->set_timeout(timeout);
  world_->set_timeout(timeout);
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
// steps hide behind the link's transfer instead of adding to it. Every rank
// of a host runs the same order of local steps: reduce 0, then for each
// i >= 1 reduce i and broadcast i - 1, then broadcast of the last piece.
Work HierarchicalEngine::all_reduce(at::Tensor& t, const Call& c) {
  return guarded("all_reduce", [&]() -> Work {
    if (!reducible({t}, c)) return world_->all_reduce(t, c);
    ++hier_calls_;
    constexpr int64_t kMinPiece = int64_t(1) << 20, kMaxPieces = 8;
    const int64_t bytes = t.numel() * int64_t(t.element_size());
    const int64_t pieces = t.is_cpu() ? std::min(kMaxPieces, bytes / kMinPiece) : 1;
    if (columns_) {
      if (t.numel() > 0) allreduce_sharded(t.view({-1}), c.op, c.timeout, std::max<int64_t>(pieces, 1));
      return enqueued_work({t});
    }
    const Call step = reducing(step_op(c.op), c.timeout);
    const Call bcast = rooted(0, c.timeout);
    if (pieces < 2) {
      local_->reduce(t, step)->wait();
      if (leads()) {
        across_hosts([&] { leaders_->all_reduce(t, step)->wait(); });
        if (is_avg(c.op)) divide_sum(t, size());
      }
      local_->broadcast(t, bcast)->wait();
      return enqueued_work({t});
    }
    const at::Tensor flat = t.view({-1});
    const int64_t n = flat.numel(), per = (n + pieces - 1) / pieces;
    const auto piece = [&](int64_t i) { return flat.narrow(0, i * per, std::min(per, n - i * per)); };
    std::vector<Work> across(pieces);
    const auto finish = [&](int64_t i) {
      at::Tensor v = piece(i);
      if (leads()) {
        across_hosts([&] { across[i]->wait(); });
        across[i].reset();
        if (is_avg(c.op)) divide_sum(v, size());
      }
      local_->broadcast(v, bcast)->wait();
    };
    for (int64_t i = 0; i < pieces; ++i) {
      at::Tensor v = piece(i);
      local_->reduce(v, step)->wait();
      if (leads()) across[i] = across_hosts([&] { return leaders_->all_reduce(v, step); });
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
void HierarchicalEngine::allreduce_sharded(const at::Tensor& flat, ReduceOp op, std::chrono::milliseconds timeout,
                                           int64_t pieces) {
  const int64_t n = flat.numel(), per = (n + pieces - 1) / pieces;
  const int k = local_->size();
  const Call step = reducing(step_op(op), timeout);
  const Call gather_step = timed(timeout);
  struct Piece {
    at::Tensor dst, whole, shard;  // dst: the caller's elements; whole: k shards (dst itself, or a scratch copy)
    Work across;
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
    std::vector<at::Tensor> outs{p.shard}, ins{p.whole};
    local_->reduce_scatter(outs, ins, step)->wait();
    p.across = across_hosts([&] { return columns_->all_reduce(p.shard, step); }, who);
  };
  const auto finish = [&](int64_t i) {
    Piece& p = ps[i];
    across_hosts([&] { p.across->wait(); }, who);
    p.across.reset();
    if (is_avg(op)) divide_sum(p.shard, size());
    std::vector<at::Tensor> outs{p.whole}, ins{p.shard};
    local_->all_gather_into(outs, ins, gather_step)->wait();
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
Work HierarchicalEngine::broadcast(at::Tensor& t, const Call& c) {
  return guarded("broadcast", [&]() -> Work {
    if (!all_dense({t})) return world_->broadcast(t, c);
    const int root = c.root, root_host = host_of_[root];
    ++hier_calls_;
    auto leaders_step = [&] {
      if (!leads()) return;
      // crosses as its bytes (c10d_engine.h)
      across_hosts([&] { leaders_->broadcast(t, rooted(root_host, c.timeout))->wait(); });
    };
    auto local_step = [&](int local_root) { local_->broadcast(t, rooted(local_root, c.timeout))->wait(); };
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
Work HierarchicalEngine::reduce(at::Tensor& t, const Call& c) {
  return guarded("reduce", [&]() -> Work {
    if (!reducible({t}, c)) {
      // gloo's reduce leaves partial results in non-root tensors (a bitwise op's
      // too); fastpar's reduce never writes them, on one host or several.
      if (rank() == c.root) return world_->reduce(t, c);
      at::Tensor scratch = t.clone();
      return world_->reduce(scratch, c);
    }
    const int root = c.root, root_host = host_of_[root];
    const auto& mine = host_ranks_[host_];
    ++hier_calls_;
    auto leaders_step = [&](at::Tensor buf) {
      across_hosts([&] { leaders_->reduce(buf, reducing(step_op(c.op), c.timeout, root_host))->wait(); });
    };
    auto local_step = [&](at::Tensor buf, int local_root) {
      local_->reduce(buf, reducing(step_op(c.op), c.timeout, local_root))->wait();
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
    if (is_avg(c.op) && rank() == root) divide_sum(t, size());
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
  at::Tensor mine_in = in, whole = out;
  const Call from_leader = rooted(0, timeout);
  if (!leads()) {
    std::vector<at::Tensor> none;
    local_->gather(none, mine_in, from_leader)->wait();
    local_->broadcast(whole, from_leader)->wait();
    return;
  }
  std::vector<at::Tensor> outs;
  for (int l = 0; l < nl; ++l) outs.push_back(out.narrow(0, mine[l] * B, B));
  local_->gather(outs, mine_in, from_leader)->wait();
  // This host's blocks, contiguous in local rank order; a copy, because the
  // leaders' step must not read what it writes.
  at::Tensor host_block = hosts_contiguous_ ? out.narrow(0, mine[0] * B, nl * B).clone() : at::cat(outs);
  bool even = true;
  for (const auto& rs : host_ranks_) even = even && rs.size() == size_t(nl);
  at::Tensor all = hosts_contiguous_ ? out : at::empty_like(out);  // host-major
  if (even) {
    std::vector<at::Tensor> alls{all}, blocks{host_block};
    across_hosts([&] { leaders_->all_gather_into(alls, blocks, timed(timeout))->wait(); });
  } else {
    std::vector<int64_t> send(H, nl * B), recv(H);
    for (int h = 0; h < H; ++h) recv[h] = int64_t(host_ranks_[h].size()) * B;
    at::Tensor rep = host_block.repeat({H});
    across_hosts([&] { leaders_->all_to_all(all, rep, recv, send, timed(timeout))->wait(); });
  }
  if (!hosts_contiguous_) {
    int64_t off = 0;
    for (const auto& rs : host_ranks_)
      for (int r : rs) {
        if (host_of_[r] != host_) out.narrow(0, r * B, B).copy_(all.narrow(0, off, B));
        off += B;
      }
  }
  local_->broadcast(whole, from_leader)->wait();
}

Work HierarchicalEngine::all_gather(std::vector<at::Tensor>& outs, at::Tensor& in, const Call& c) {
  return guarded("all_gather", [&]() -> Work {
    if (!all_dense(outs)) return world_->all_gather(outs, in, c);
    const int64_t B = in.numel() * int64_t(in.element_size());
    ++hier_calls_;
    at::Tensor flat = at::empty({B * size()}, in.options().dtype(at::kByte));
    all_gather_bytes(bytes(in), flat, c.timeout);
    for (int q = 0; q < size(); ++q) bytes(outs[size_t(q)]).copy_(flat.narrow(0, q * B, B));
    return enqueued_work(outs);
  });
}

Work HierarchicalEngine::all_gather_into(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
                                         const Call& c) {
  return guarded(outs.size() == 1 ? "all_gather_into_tensor" : "all_gather_into_tensor_coalesced", [&]() -> Work {
    for (size_t i = 0; i < outs.size(); ++i) {
      ++hier_calls_;
      all_gather_bytes(bytes(ins[i]), bytes(outs[i]), c.timeout);
    }
    return enqueued_work(outs);
  });
}

// Local reduce of the whole input to the leader; the leaders' reduce_scatter
// hands each host only its ranks' blocks (host-major, every host padded to
// the largest host's rank count when hosts differ); local scatter of each
// local rank's block from the leader.
void HierarchicalEngine::reduce_scatter_flat(const at::Tensor& output, const at::Tensor& input, ReduceOp op,
                                             bool avg, std::chrono::milliseconds timeout) {
  const int64_t count = output.numel();
  const auto& mine = host_ranks_[host_];
  const int H = int(host_ranks_.size()), nl = int(mine.size());
  const Call r = reducing(op, timeout);
  const Call s = rooted(0, timeout);
  at::Tensor out = output;
  if (!leads()) {
    at::Tensor v = input;  // read, not written: this rank is not the local root
    local_->reduce(v, r)->wait();
    std::vector<at::Tensor> none;
    local_->scatter(out, none, s)->wait();
    return;
  }
  at::Tensor host_sum = input.clone();
  local_->reduce(host_sum, r)->wait();
  size_t most = 0;
  for (const auto& rs : host_ranks_) most = std::max(most, rs.size());
  const int64_t per_host = int64_t(most) * count;
  at::Tensor host_major = host_sum;
  if (!hosts_contiguous_ || most * H != size_t(size())) {
    host_major = at::zeros({H * per_host}, output.options());
    for (int h = 0; h < H; ++h)
      for (size_t i = 0; i < host_ranks_[h].size(); ++i)
        host_major.narrow(0, h * per_host + int64_t(i) * count, count)
            .copy_(host_sum.narrow(0, host_ranks_[h][i] * count, count));
  }
  at::Tensor block = at::empty({per_host}, output.options());
  std::vector<at::Tensor> blocks{block}, majors{host_major};
  across_hosts([&] { leaders_->reduce_scatter(blocks, majors, reducing(op, timeout))->wait(); });
  if (avg) divide_sum(block.narrow(0, 0, nl * count), size());
  std::vector<at::Tensor> ins;
  for (int l = 0; l < nl; ++l) ins.push_back(block.narrow(0, l * count, count));
  local_->scatter(out, ins, s)->wait();
}

Work HierarchicalEngine::reduce_scatter(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins, const Call& c) {
  return guarded(outs.size() == 1 ? "reduce_scatter_tensor" : "reduce_scatter_tensor_coalesced", [&]() -> Work {
    if (!reducible(outs, c)) return world_->reduce_scatter(outs, ins, c);
    for (size_t i = 0; i < outs.size(); ++i) {
      ++hier_calls_;
      reduce_scatter_flat(outs[i].view({-1}), ins[i].view({-1}), step_op(c.op), is_avg(c.op), c.timeout);
    }
    return enqueued_work(outs);
  });
}

Work HierarchicalEngine::gather(std::vector<at::Tensor>& outs, at::Tensor& in, const Call& c) {
  return guarded("gather", [&]() -> Work { return world_->gather(outs, in, c); });
}

Work HierarchicalEngine::scatter(at::Tensor& out, std::vector<at::Tensor>& ins, const Call& c) {
  return guarded("scatter", [&]() -> Work { return world_->scatter(out, ins, c); });
}

Work HierarchicalEngine::all_to_all(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits,
                                    std::vector<int64_t>& in_splits, const Call& c) {
  return guarded("all_to_all_single",
                 [&]() -> Work { return world_->all_to_all(out, in, out_splits, in_splits, c); });
}

Work HierarchicalEngine::send(at::Tensor& t, int peer, int tag) {
  return guarded("send", [&]() -> Work { return world_->send(t, peer, tag); });
}

Work HierarchicalEngine::recv(at::Tensor& t, int peer, int tag) {
  return guarded("recv", [&]() -> Work { return world_->recv(t, peer, tag); });
}

// Everyone in the host, then the hosts' leaders, then everyone in the host
// again: a rank leaves only after every rank of every host has arrived.
Work HierarchicalEngine::barrier(const Call& c) {
  return guarded("barrier", [&]() -> Work {
    local_->barrier(c)->wait();
    if (leads()) across_hosts([&] { leaders_->barrier(c)->wait(); });
    local_->barrier(c)->wait();
    return enqueued_work({});
  });
}

void register_hierarchical_engine(pybind11::module& m) {
  namespace py = pybind11;
  py::module::import("torch._C._distributed_c10d");  // registers c10d::Backend with pybind first
  py::class_<HierarchicalEngine, Engine, c10::intrusive_ptr<HierarchicalEngine>>(m, "HierarchicalEngine", R"(
fastpar's engine for ranks on several hosts, composed of `local` (this host's
ranks: a fastpar engine, or a torch backend), `leaders` (each host's lowest
rank; None elsewhere) and `world` (every rank), gloo or NCCL groups:
all_reduce, broadcast, reduce, all_gather and reduce_scatter run as local
steps around one leaders' call; everything else goes to `world`. With
`columns` (the ranks of this rank's local index on every host; hosts of equal
size), all_reduce runs sharded: local reduce_scatter, each column's
all_reduce, local all_gather. With `store` (the group's) and
`failure_poll_ms` > 0, a failed call tells the group through the store, a
rank waiting in gloo between hosts looks for such a failure every
`failure_poll_ms` and raises on finding one, and every call after a failure
raises at once (failure_notice.h).)")
      .def(py::init([](int rank, int size, std::vector<int> host_of, py::object local,
                       std::optional<c10::intrusive_ptr<c10d::Backend>> leaders,
                       const c10::intrusive_ptr<c10d::Backend>& world,
                       std::optional<c10::intrusive_ptr<c10d::Backend>> columns,
                       std::optional<c10::intrusive_ptr<c10d::Store>> store, int64_t failure_poll_ms) {
             // A torch backend as `local` runs behind a C10dEngine (tests
             // compose hosts of gloo groups).
             c10::intrusive_ptr<Engine> engine;
             if (py::isinstance<Engine>(local)) engine = local.cast<c10::intrusive_ptr<Engine>>();
             else engine = c10d_engine(local.cast<c10::intrusive_ptr<c10d::Backend>>(), rank, false);
             return c10::make_intrusive<HierarchicalEngine>(
                 rank, size, std::move(host_of), engine, leaders.value_or(nullptr), world, columns.value_or(nullptr),
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
