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

at::Tensor Engine::registered_empty(const std::vector<int64_t>&, at::ScalarType, int) {
  TORCH_CHECK_VALUE(false, "fastpar.registered_empty: this group's ranks are on several hosts; registered tensors "
                    "live in one host's shared memory or CUDA IPC arena");
}

bool Engine::is_registered(const at::Tensor&) const { return false; }

}  // namespace distributed
}  // namespace fastpar
