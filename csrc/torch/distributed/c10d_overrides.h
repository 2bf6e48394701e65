// The c10d::Backend methods fastpar's classes override, each signature
// spelled once. A class lists the ones it implements, one line each:
//   FASTPAR_C10D_BROADCAST;
// so backend.h, engine.h and each engine read as the table of what they
// serve, and a signature torch changes is changed here. The definitions in
// the .cpp files spell the signatures out, as C++ requires (`override`
// makes the compiler hold each declaration to torch's).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <vector>

#include "c10d_compat.h"

#define FASTPAR_C10D_WORK c10::intrusive_ptr<c10d::Work>
#define FASTPAR_C10D_TENSORS std::vector<at::Tensor>
#define FASTPAR_C10D_LISTS std::vector<std::vector<at::Tensor>>

#define FASTPAR_C10D_BROADCAST \
  FASTPAR_C10D_WORK broadcast(FASTPAR_C10D_TENSORS& tensors, const c10d::BroadcastOptions& opts) override
#define FASTPAR_C10D_ALLREDUCE \
  FASTPAR_C10D_WORK allreduce(FASTPAR_C10D_TENSORS& tensors, const c10d::AllreduceOptions& opts) override
#define FASTPAR_C10D_ALLREDUCE_SPARSE \
  FASTPAR_C10D_WORK allreduce_sparse(FASTPAR_C10D_TENSORS& tensors, const c10d::AllreduceOptions& opts) override
#define FASTPAR_C10D_ALLREDUCE_COALESCED                                                   \
  FASTPAR_C10D_WORK allreduce_coalesced(FASTPAR_C10D_TENSORS& tensors,                    \
                                        const c10d::AllreduceCoalescedOptions& opts) override
#define FASTPAR_C10D_REDUCE \
  FASTPAR_C10D_WORK reduce(FASTPAR_C10D_TENSORS& tensors, const c10d::ReduceOptions& opts) override
#define FASTPAR_C10D_ALLGATHER                                                              \
  FASTPAR_C10D_WORK allgather(FASTPAR_C10D_LISTS& outputs, FASTPAR_C10D_TENSORS& inputs, \
                              const c10d::AllgatherOptions& opts) override
#define FASTPAR_C10D_ALLGATHER_BASE \
  FASTPAR_C10D_WORK _allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) override
#define FASTPAR_C10D_ALLGATHER_COALESCED                                                              \
  FASTPAR_C10D_WORK allgather_coalesced(FASTPAR_C10D_LISTS& outputs, FASTPAR_C10D_TENSORS& inputs, \
                                        const c10d::AllgatherOptions& opts) override
#define FASTPAR_C10D_ALLGATHER_INTO_TENSOR_COALESCED                                                             \
  FASTPAR_C10D_WORK allgather_into_tensor_coalesced(FASTPAR_C10D_TENSORS& outputs, FASTPAR_C10D_TENSORS& inputs, \
                                                    const c10d::AllgatherOptions& opts) override
#define FASTPAR_C10D_GATHER                                                              \
  FASTPAR_C10D_WORK gather(FASTPAR_C10D_LISTS& outputs, FASTPAR_C10D_TENSORS& inputs, \
                           const c10d::GatherOptions& opts) override
// gather_single / gather_into_tensor are new in torch 2.14: declare it under
// `#if FASTPAR_TORCH_AT_LEAST(2, 14)`.
#define FASTPAR_C10D_GATHER_INTO_TENSOR \
  FASTPAR_C10D_WORK gather_into_tensor(at::Tensor& output, at::Tensor& input, const c10d::GatherOptions& opts) override
#define FASTPAR_C10D_SCATTER                                                             \
  FASTPAR_C10D_WORK scatter(FASTPAR_C10D_TENSORS& outputs, FASTPAR_C10D_LISTS& inputs, \
                            const c10d::ScatterOptions& opts) override
#define FASTPAR_C10D_REDUCE_SCATTER                                                             \
  FASTPAR_C10D_WORK reduce_scatter(FASTPAR_C10D_TENSORS& outputs, FASTPAR_C10D_LISTS& inputs, \
                                   const c10d::ReduceScatterOptions& opts) override
#define FASTPAR_C10D_REDUCE_SCATTER_BASE                                 \
  FASTPAR_C10D_WORK _reduce_scatter_base(at::Tensor& output, at::Tensor& input, \
                                         const c10d::ReduceScatterOptions& opts) override
#define FASTPAR_C10D_REDUCE_SCATTER_TENSOR_COALESCED                                                             \
  FASTPAR_C10D_WORK reduce_scatter_tensor_coalesced(FASTPAR_C10D_TENSORS& outputs, FASTPAR_C10D_TENSORS& inputs, \
                                                    const c10d::ReduceScatterOptions& opts) override
#define FASTPAR_C10D_ALLTOALL_BASE                                                                       \
  FASTPAR_C10D_WORK alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes, \
                                  std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) override
#define FASTPAR_C10D_ALLTOALL                                                                 \
  FASTPAR_C10D_WORK alltoall(FASTPAR_C10D_TENSORS& outputs, FASTPAR_C10D_TENSORS& inputs, \
                             const c10d::AllToAllOptions& opts) override
#define FASTPAR_C10D_BARRIER FASTPAR_C10D_WORK barrier(const c10d::BarrierOptions& opts) override
#define FASTPAR_C10D_SEND FASTPAR_C10D_WORK send(FASTPAR_C10D_TENSORS& tensors, int dst_rank, int tag) override
#define FASTPAR_C10D_RECV FASTPAR_C10D_WORK recv(FASTPAR_C10D_TENSORS& tensors, int src_rank, int tag) override
#define FASTPAR_C10D_RECV_ANYSOURCE FASTPAR_C10D_WORK recvAnysource(FASTPAR_C10D_TENSORS& tensors, int tag) override
