// Every argument check of the torch.distributed backend, once, for every
// device: the front (backend.h) runs them before it picks an engine, so a
// bad call gets the same words on CPU and CUDA tensors and no engine checks
// again. What one engine cannot serve but another can is not a bad call:
// CUDA tensors' layouts, dtypes and reduce ops the IPC kernels lack go to the
// CUDA engine's route (reducible(), route.h). Each message names the op (as torch.distributed spells it), the
// argument, the index and both values, e.g.
//   "fastpar.all_gather: output_tensors[0][1] has 4 elements but 3 were expected (...)"
// tests/c10d/test_collectives.py (sc_bad_input), tests/c10d/
// test_coalesced_checks.py and test_cuda_backend_plumbing.py pin them.
#pragma once

#include <torch/csrc/distributed/c10d/Types.hpp>
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "../../core/kernels/reduce_ops.h"
#include "../dtypes.h"

namespace fastpar {
namespace distributed {
namespace checks {

// Torch's API passes lists; fastpar runs one tensor per process, as NCCL does.
void one(const char* op, const char* arg, size_t got);

// A tensor the call reads or writes: defined, dense, on a CPU or CUDA device.
// Any strides: the front stages CPU tensors that are not contiguous
// (backend.cpp, Staging), CUDA engines route them (route.h).
void tensor(const char* op, const std::string& name, const at::Tensor& t);

// Point to point wants contiguous tensors, as gloo's and NCCL's do.
void contiguous(const char* op, const std::string& name, const at::Tensor& t);

// `t` like `ref`: same dtype and device type, `numel` elements.
void like(const char* op, const std::string& name, const at::Tensor& t, const std::string& ref_name,
          const at::Tensor& ref, int64_t numel, const std::string& why);

// `list` holds one tensor per rank, each like `ref` with `numel` elements.
void per_rank(const char* op, const std::string& arg, const std::vector<at::Tensor>& list, int ranks,
              const std::string& ref_name, const at::Tensor& ref, int64_t numel);

// gather's output lists / scatter's input lists: on the root exactly one list
// of one tensor per rank, each like `ref`; elsewhere none.
void root_lists(const char* op, const char* arg, const std::vector<std::vector<at::Tensor>>& lists, int rank,
                int root, int ranks, const std::string& ref_name, const at::Tensor& ref);

void root(const char* op, int64_t root, int ranks);
void peer(const char* op, const char* arg, int64_t peer, int rank, int ranks);

// The reduction of `t` (named `name`): a ReduceOp fastpar computes, on a dtype
// it reduces: the arithmetic ops on every dtype the element math has and on
// bool (not AVG), the bitwise ops on integers and bool, SUM and AVG on complex
// dtypes, as gloo. Returns it as the element math names it.
ReduceOp reduction(const char* op, const c10d::ReduceOp& r, const std::string& name, const at::Tensor& t);

// The front's check of a reducing call: reduction() on CPU tensors. What the
// CUDA kernels lack (a dtype such as bool, PREMUL_SUM, the bitwise ops) the
// CUDA engine's route hands to NCCL, as NCCL users expect, or refuses by name
// where ranks share a GPU and NCCL cannot run (route.h); the CPU has no other
// engine to hand it to.
void reducible(const char* op, const c10d::ReduceOp& r, const std::string& name, const at::Tensor& t);

// Coalesced forms: `outputs` and `inputs` pair up, entry by entry.
void pairs(const char* op, size_t outputs, size_t inputs);

// The coalesced flat forms (all_gather_into_tensor_coalesced: `small` are the
// inputs; reduce_scatter_tensor_coalesced: the outputs): `outputs` and
// `inputs` pair up, at least one pair; every small[i] is like small[0] and,
// where `reduce` is given, reducible by it; every flat[i] holds world size x
// small[i]'s elements. Checked pair by pair, the small tensor first.
void coalesced_flat(const char* op, const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                    bool small_is_output, int ranks, const c10d::ReduceOp* reduce);

// all_to_all_single's split sizes of `arg` ("input" / "output") for a tensor
// of `rows` rows of `unit` each (elements or bytes): `unit` x rows per rank,
// an even split when `splits` is empty. The front checks them in elements
// (splits()), the CUDA engine counts them in bytes with the same function.
std::vector<int64_t> all_to_all_split(const char* arg, const std::vector<int64_t>& splits, int64_t rows, int64_t unit,
                                      int ranks);

// all_to_all_single's element counts per rank for `arg` ("input"/"output"),
// from its split sizes (rows; even when empty).
std::vector<int64_t> splits(const char* arg, const std::vector<int64_t>& sizes, const at::Tensor& t, int ranks);

// An all-to-all's block to itself: the bytes a rank sends itself must be the
// bytes it expects from itself (both are its own arguments).
void own_block(const char* op, int64_t sends, int64_t expects);

// Elements in one row (first dimension) of `t`.
int64_t row_elems(const at::Tensor& t);

}  // namespace checks
}  // namespace distributed
}  // namespace fastpar
