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

// The three shapes most of torch's signatures take.
#define FASTPAR_C10D_ON(name, Options) \
  c10::intrusive_ptr<c10d::Work> name(std::vector<at::Tensor>& tensors, const c10d::Options& opts) override
#define FASTPAR_C10D_FLAT(name, Options) \
  c10::intrusive_ptr<c10d::Work> name(at::Tensor& output, at::Tensor& input, const c10d::Options& opts) override
#define FASTPAR_C10D_LISTS(name, Outputs, Inputs, Options) \
  c10::intrusive_ptr<c10d::Work> name(Outputs& outputs, Inputs& inputs, const c10d::Options& opts) override
#define FASTPAR_C10D_TENSORS std::vector<at::Tensor>
#define FASTPAR_C10D_LIST_OF_LISTS std::vector<std::vector<at::Tensor>>

#define FASTPAR_C10D_BROADCAST FASTPAR_C10D_ON(broadcast, BroadcastOptions)
#define FASTPAR_C10D_ALLREDUCE FASTPAR_C10D_ON(allreduce, AllreduceOptions)
#define FASTPAR_C10D_ALLREDUCE_SPARSE FASTPAR_C10D_ON(allreduce_sparse, AllreduceOptions)
#define FASTPAR_C10D_ALLREDUCE_COALESCED FASTPAR_C10D_ON(allreduce_coalesced, AllreduceCoalescedOptions)
#define FASTPAR_C10D_REDUCE FASTPAR_C10D_ON(reduce, ReduceOptions)
#define FASTPAR_C10D_ALLGATHER \
  FASTPAR_C10D_LISTS(allgather, FASTPAR_C10D_LIST_OF_LISTS, FASTPAR_C10D_TENSORS, AllgatherOptions)
#define FASTPAR_C10D_ALLGATHER_BASE FASTPAR_C10D_FLAT(_allgather_base, AllgatherOptions)
#define FASTPAR_C10D_ALLGATHER_COALESCED \
  FASTPAR_C10D_LISTS(allgather_coalesced, FASTPAR_C10D_LIST_OF_LISTS, FASTPAR_C10D_TENSORS, AllgatherOptions)
#define FASTPAR_C10D_ALLGATHER_INTO_TENSOR_COALESCED \
  FASTPAR_C10D_LISTS(allgather_into_tensor_coalesced, FASTPAR_C10D_TENSORS, FASTPAR_C10D_TENSORS, AllgatherOptions)
#define FASTPAR_C10D_GATHER \
  FASTPAR_C10D_LISTS(gather, FASTPAR_C10D_LIST_OF_LISTS, FASTPAR_C10D_TENSORS, GatherOptions)
// gather_single / gather_into_tensor are new in torch 2.14: declare it under
// `#if FASTPAR_TORCH_AT_LEAST(2, 14)`.
#define FASTPAR_C10D_GATHER_INTO_TENSOR FASTPAR_C10D_FLAT(gather_into_tensor, GatherOptions)
#define FASTPAR_C10D_SCATTER \
  FASTPAR_C10D_LISTS(scatter, FASTPAR_C10D_TENSORS, FASTPAR_C10D_LIST_OF_LISTS, ScatterOptions)
#define FASTPAR_C10D_REDUCE_SCATTER \
  FASTPAR_C10D_LISTS(reduce_scatter, FASTPAR_C10D_TENSORS, FASTPAR_C10D_LIST_OF_LISTS, ReduceScatterOptions)
#define FASTPAR_C10D_REDUCE_SCATTER_BASE FASTPAR_C10D_FLAT(_reduce_scatter_base, ReduceScatterOptions)
#define FASTPAR_C10D_REDUCE_SCATTER_TENSOR_COALESCED \
  FASTPAR_C10D_LISTS(reduce_scatter_tensor_coalesced, FASTPAR_C10D_TENSORS, FASTPAR_C10D_TENSORS, ReduceScatterOptions)
#define FASTPAR_C10D_ALLTOALL FASTPAR_C10D_LISTS(alltoall, FASTPAR_C10D_TENSORS, FASTPAR_C10D_TENSORS, AllToAllOptions)
#define FASTPAR_C10D_ALLTOALL_BASE                                                                                     \
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,                                  \
                                               std::vector<int64_t>& output_split_sizes,                               \
                                               std::vector<int64_t>& input_split_sizes,                                \
                                               const c10d::AllToAllOptions& opts) override
#define FASTPAR_C10D_BARRIER c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override
#define FASTPAR_C10D_SEND \
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override
#define FASTPAR_C10D_RECV \
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override
#define FASTPAR_C10D_RECV_ANYSOURCE \
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override
