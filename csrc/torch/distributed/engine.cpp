#include "engine.h"

#include <ATen/core/ivalue.h>

#include <numeric>

namespace fastpar {
namespace distributed {

c10::intrusive_ptr<c10d::Work> enqueued_work(std::vector<at::Tensor> outputs) {
  std::vector<c10::Device> devices;
  if (!outputs.empty() && !outputs[0].is_cpu()) devices.push_back(outputs[0].device());
  auto fut = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
  fut->markCompleted(c10::IValue(outputs));
  return c10d::Work::create_from_future(fut);
}

// Every entry's Work is waited before the next starts: on the CPU the calls
// have finished; on a GPU wait() only orders the caller's stream after them,
// so the whole call is still enqueued without blocking the host.
void Engine::allreduce_direct(at::Tensor& t, const c10d::AllreduceOptions& opts) {
  std::vector<at::Tensor> ts{t};
  allreduce(ts, opts)->wait();
}

c10::intrusive_ptr<c10d::Work> Engine::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceCoalescedOptions& opts) {
  for (auto& t : tensors) {
    std::vector<at::Tensor> one{t};
    allreduce(one, opts)->wait();
  }
  return enqueued_work(tensors);
}

c10::intrusive_ptr<c10d::Work> Engine::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllgatherOptions& opts) {
  // outputs[r][i] receives rank r's inputs[i].
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<std::vector<at::Tensor>> outs(1);
    for (auto& list : outputs) outs[0].push_back(list[i]);
    std::vector<at::Tensor> ins{inputs[i]};
    allgather(outs, ins, opts)->wait();
  }
  std::vector<at::Tensor> all;
  for (const auto& list : outputs) all.insert(all.end(), list.begin(), list.end());
  return enqueued_work(std::move(all));
}

c10::intrusive_ptr<c10d::Work> Engine::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                       std::vector<at::Tensor>& inputs,
                                                                       const c10d::AllgatherOptions& opts) {
  for (size_t i = 0; i < inputs.size(); ++i) _allgather_base(outputs[i], inputs[i], opts)->wait();
  return enqueued_work(outputs);
}

c10::intrusive_ptr<c10d::Work> Engine::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                       std::vector<at::Tensor>& inputs,
                                                                       const c10d::ReduceScatterOptions& opts) {
  for (size_t i = 0; i < outputs.size(); ++i) _reduce_scatter_base(outputs[i], inputs[i], opts)->wait();
  return enqueued_work(outputs);
}

c10::intrusive_ptr<c10d::Work> Engine::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                      std::vector<std::vector<at::Tensor>>& inputs,
                                                      const c10d::ReduceScatterOptions& opts) {
  at::Tensor flat = at::cat(inputs[0]);
  _reduce_scatter_base(outputs[0], flat, opts)->wait();
  return enqueued_work(outputs);
}

c10::intrusive_ptr<c10d::Work> Engine::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                const c10d::AllToAllOptions& opts) {
  const int n = getSize();
  std::vector<at::Tensor> flat_in;
  std::vector<int64_t> send, recv;
  for (int q = 0; q < n; ++q) {
    flat_in.push_back(inputs[q].reshape({-1}));
    send.push_back(inputs[q].numel());
    recv.push_back(outputs[q].numel());
  }
  at::Tensor packed_in = at::cat(flat_in);
  at::Tensor packed_out = at::empty({std::accumulate(recv.begin(), recv.end(), int64_t(0))}, packed_in.options());
  // Copies: some backends leave the split vectors they are given moved-from.
  std::vector<int64_t> recv_arg = recv, send_arg = send;
  alltoall_base(packed_out, packed_in, recv_arg, send_arg, opts)->wait();
  int64_t off = 0;
  for (int q = 0; q < n; ++q) {
    outputs[q].view({-1}).copy_(packed_out.narrow(0, off, recv[q]));
    off += recv[q];
  }
  return enqueued_work(outputs);
}

#if FASTPAR_TORCH_AT_LEAST(2, 14)
c10::intrusive_ptr<c10d::Work> Engine::gather_into_tensor(at::Tensor& output, at::Tensor& input,
                                                          const c10d::GatherOptions& opts) {
  std::vector<std::vector<at::Tensor>> outs;
  if (getRank() == opts.rootRank) {
    outs.emplace_back();
    const int64_t k = input.numel();
    for (int q = 0; q < getSize(); ++q) outs[0].push_back(output.view({-1}).narrow(0, q * k, k));
  }
  std::vector<at::Tensor> ins{input.reshape({-1})};
  gather(outs, ins, opts)->wait();
  return enqueued_work({output});
}
#endif

c10::intrusive_ptr<c10d::Work> Engine::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                        const c10d::AllreduceOptions& opts) {
  at::Tensor& t = tensors[0];
  const int n = getSize();
  const at::Tensor mine = t.coalesce();
  const auto i64 = at::TensorOptions().dtype(at::kLong).device(t.device());
  // How many entries each rank has; then every rank's indices and values,
  // padded to the largest count, in one all_gather each.
  at::Tensor counts = at::empty({n}, i64);
  at::Tensor nnz = at::full({1}, mine._nnz(), i64);
  _allgather_base(counts, nnz, {})->wait();
  const at::Tensor host_counts = counts.cpu();
  const int64_t most = host_counts.max().item<int64_t>();
  auto padded = [&](const at::Tensor& x, int64_t dim) {
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes[dim] = most;
    at::Tensor p = at::zeros(sizes, x.options());
    p.narrow(dim, 0, x.size(dim)).copy_(x);
    return p;
  };
  at::Tensor idx = padded(mine._indices(), 1), val = padded(mine._values(), 0);
  std::vector<int64_t> idx_all = idx.sizes().vec(), val_all = val.sizes().vec();
  idx_all.insert(idx_all.begin(), n);
  val_all.insert(val_all.begin(), n);
  at::Tensor idxs = at::empty(idx_all, idx.options()), vals = at::empty(val_all, val.options());
  _allgather_base(idxs, idx, {})->wait();
  _allgather_base(vals, val, {})->wait();
  at::Tensor sum;
  for (int r = 0; r < n; ++r) {
    const int64_t k = host_counts[r].item<int64_t>();
    at::Tensor part = at::sparse_coo_tensor(idxs[r].narrow(1, 0, k), vals[r].narrow(0, 0, k), t.sizes());
    sum = r == 0 ? part : sum + part;
  }
  t.copy_(sum.coalesce());
  return enqueued_work(tensors);
}

void Engine::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  // One byte each way over point to point, on a tag no user send can have.
  constexpr int kTag = INT32_MIN + 7;
  const std::chrono::milliseconds timeout = opts.timeout;  // torch always passes one; 0 times out at once, as gloo
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      deadline - std::chrono::steady_clock::now()));
  };
  std::vector<at::Tensor> token{at::zeros({1}, at::kByte)};
  if (getRank() != 0) {
    send(token, 0, kTag)->wait(left());
    c10::intrusive_ptr<c10d::Work> release = recv(token, 0, kTag);
    try {
      release->wait(left());
    } catch (const std::exception& e) {
      late_tokens_.push_back(release);  // still posted: keep its buffer alive
      C10_THROW_ERROR(DistBackendError, "Rank " + std::to_string(getRank()) +
                                            " successfully reached monitoredBarrier, but received errors while "
                                            "waiting for send/recv from rank 0. Please check rank 0 logs for "
                                            "faulty rank (" + e.what() + ")");
    }
    return;
  }
  TORCH_CHECK_WITH(DistBackendError, timeout.count() > 0, "Rank 0 timed out in monitoredBarrier after ",
                   timeout.count(), " ms");
  std::vector<int> missing;
  for (int r = 1; r < getSize(); ++r) {
    std::vector<at::Tensor> got{at::zeros({1}, at::kByte)};
    c10::intrusive_ptr<c10d::Work> work = recv(got, r, kTag);
    try {
      work->wait(left());
    } catch (const std::exception&) {
      // The receive stays posted (a late rank's token lands there): its
      // Work keeps the buffer alive.
      late_tokens_.push_back(work);
      missing.push_back(r);
      if (!wait_all_ranks) break;
    }
  }
  if (!missing.empty()) {
    std::string ranks;
    for (int r : missing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    C10_THROW_ERROR(DistBackendError, "[Rank 0]: Rank" + std::string(missing.size() > 1 ? "s " : " ") + ranks +
                                          " failed to pass monitoredBarrier in " + std::to_string(timeout.count()) +
                                          " ms");
  }
  for (int r = 1; r < getSize(); ++r) send(token, r, kTag)->wait(left());
}

at::Tensor Engine::registered_empty(const std::vector<int64_t>&, at::ScalarType, int) {
  TORCH_CHECK_VALUE(false, "fastpar.registered_empty: this group's ranks are on several hosts; registered tensors "
                    "live in one host's shared memory or CUDA IPC arena");
}

bool Engine::is_registered(const at::Tensor&) const { return false; }

}  // namespace distributed
}  // namespace fastpar
