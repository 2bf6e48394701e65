#include "checks.h"

#include "../dtypes.h"  // dtype_str, maybe_dtype, indexed: the words the list ops use too

namespace fastpar {
namespace distributed {
namespace checks {

static std::string device_str(const at::Tensor& t) { return "'" + t.device().str() + "'"; }

void one(const char* op, const char* arg, size_t got) {
  TORCH_CHECK_VALUE(got == 1, "fastpar.", op, ": expected exactly one tensor in ", arg, " (one per process), got ",
                    got);
}

void tensor(const char* op, const std::string& name, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.defined(), "fastpar.", op, ": ", name, " is an undefined tensor");
  TORCH_CHECK_VALUE(t.is_cpu() || t.is_cuda(), "fastpar.", op, ": ", name, " is on device ", device_str(t),
                    " but the fastpar backend handles CPU and CUDA tensors only");
  TORCH_CHECK_VALUE(!t.is_sparse(), "fastpar.", op, ": ", name, " is a sparse tensor (layout ", t.layout(),
                    "); fastpar reduces dense tensors (call .to_dense() first)");
}

void contiguous(const char* op, const std::string& name, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.is_contiguous(), "fastpar.", op, ": ", name, " must be contiguous, but it has sizes ",
                    t.sizes(), " and strides ", t.strides(), " (call .contiguous() first)");
}

void like(const char* op, const std::string& name, const at::Tensor& t, const std::string& ref_name,
          const at::Tensor& ref, int64_t numel, const std::string& why) {
  TORCH_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), "fastpar.", op, ": ", name, " has dtype ",
                   dtype_str(t.scalar_type()), " but ", ref_name, " has dtype ",
                   dtype_str(ref.scalar_type()));
  TORCH_CHECK_VALUE(t.device().type() == ref.device().type(), "fastpar.", op, ": ", name, " is on device ",
                    device_str(t), " but ", ref_name, " is on device ", device_str(ref),
                    "; all tensors must be CPU tensors or all CUDA tensors");
  TORCH_CHECK_VALUE(t.numel() == numel, "fastpar.", op, ": ", name, " has ", t.numel(), " elements but ", numel,
                    " were expected (", why, ")");
}

void per_rank(const char* op, const std::string& arg, const std::vector<at::Tensor>& list, int ranks,
              const std::string& ref_name, const at::Tensor& ref, int64_t numel) {
  TORCH_CHECK_VALUE(list.size() == size_t(ranks), "fastpar.", op, ": ", arg, " has ", list.size(),
                    " tensors but the group has ", ranks, " ranks");
  for (size_t q = 0; q < list.size(); ++q) {
    const std::string name = indexed(arg, q);
    tensor(op, name, list[q]);
    like(op, name, list[q], ref_name, ref, numel, "the same number of elements as " + ref_name);
  }
}

void root(const char* op, int64_t root, int ranks) {
  TORCH_CHECK_VALUE(root >= 0 && root < ranks, "fastpar.", op, ": root is ", root, " but the group has ", ranks,
                    " ranks (0..", ranks - 1, ")");
}

void peer(const char* op, const char* arg, int64_t peer, int rank, int ranks) {
  TORCH_CHECK_VALUE(peer >= 0 && peer < ranks && peer != rank, "fastpar.", op, ": ", arg, " is ", peer,
                    " but must be another rank of the ", ranks, "-rank group (this is rank ", rank, ")");
}

void root_lists(const char* op, const char* arg, const std::vector<std::vector<at::Tensor>>& lists, int rank,
                int root_rank, int ranks, const std::string& ref_name, const at::Tensor& ref) {
  root(op, root_rank, ranks);
  if (rank == root_rank) {
    one(op, arg, lists.size());
    per_rank(op, std::string(arg) + "[0]", lists[0], ranks, ref_name, ref, ref.numel());
  } else {
    TORCH_CHECK_VALUE(lists.empty() || (lists.size() == 1 && lists[0].empty()), "fastpar.", op, ": rank ", rank,
                      " is not the root (", root_rank, ") and must pass no ", arg, ", got ", lists.size(), " lists");
  }
}

// c10d's RedOpType by name, for messages: PREMUL_SUM (8) and beyond by value.
static std::string op_str(int v) {
  if (v >= 0 && v <= int(ReduceOp::BXOR)) return std::string("ReduceOp.") + op_name(ReduceOp(v));
  if (v == int(c10d::ReduceOp::PREMUL_SUM)) return "ReduceOp.PREMUL_SUM";
  return "ReduceOp value " + std::to_string(v);
}

ReduceOp reduction(const char* op, const c10d::ReduceOp& r, const std::string& name, const at::Tensor& t) {
  const int v = int(r.op_);
  TORCH_CHECK_VALUE(v >= 0 && v <= int(ReduceOp::BXOR), "fastpar.", op, ": op is ", op_str(v),
                    ", which fastpar does not support (supported: SUM, AVG, PRODUCT, MIN, MAX; BAND, BOR, BXOR "
                    "on integer and bool tensors)");
  const ReduceOp rop = ReduceOp(v);
  const at::ScalarType dtype = t.scalar_type();
  if (dtype == at::kBool) {
    TORCH_CHECK_VALUE(rop != ReduceOp::AVG, "fastpar.", op, ": op is ReduceOp.AVG but ", name,
                      " has dtype torch.bool, which has no mean (use SUM for a logical or, PRODUCT for an and)");
    return rop;
  }
  if (at::isComplexType(dtype)) {
    TORCH_CHECK_VALUE(rop == ReduceOp::SUM || rop == ReduceOp::AVG, "fastpar.", op, ": op is ", op_str(v), " but ",
                      name, " has dtype ", dtype_str(dtype), ", which reduces with SUM and AVG only");
    return rop;
  }
  TORCH_CHECK_TYPE(maybe_dtype(dtype).has_value(), "fastpar.", op, ": ", name, " has dtype ",
                   dtype_str(dtype), ", which fastpar does not reduce (supported: float32, float64, float16, "
                   "bfloat16, int8, uint8, int32, int64, bool; complex64 and complex128 with SUM and AVG)");
  TORCH_CHECK_TYPE(!is_bitwise(rop) || !at::isFloatingType(dtype), "fastpar.", op, ": op is ", op_str(v),
                   ", which reduces integer and bool tensors, but ", name, " has dtype ", dtype_str(dtype));
  return rop;
}

void reducible(const char* op, const c10d::ReduceOp& r, const std::string& name, const at::Tensor& t) {
  if (!t.is_cuda()) reduction(op, r, name, t);
}

void pairs(const char* op, size_t outputs, size_t inputs) {
  TORCH_CHECK_VALUE(outputs == inputs, "fastpar.", op, ": outputs has ", outputs, " entries but inputs has ", inputs,
                    " (one output per input)");
}

void coalesced_flat(const char* op, const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                    bool small_is_output, int ranks, const c10d::ReduceOp* reduce) {
  pairs(op, outputs.size(), inputs.size());
  const char* small_arg = small_is_output ? "outputs" : "inputs";
  const char* flat_arg = small_is_output ? "inputs" : "outputs";
  const std::vector<at::Tensor>& small = small_is_output ? outputs : inputs;
  const std::vector<at::Tensor>& flat = small_is_output ? inputs : outputs;
  TORCH_CHECK_VALUE(!small.empty(), "fastpar.", op, ": ", small_arg, " is an empty list");
  for (size_t i = 0; i < small.size(); ++i) {
    const std::string s = indexed(small_arg, i), f = indexed(flat_arg, i);
    tensor(op, s, small[i]);
    like(op, s, small[i], indexed(small_arg, 0), small[0], small[i].numel(), "");
    if (reduce) reducible(op, *reduce, s, small[i]);
    tensor(op, f, flat[i]);
    like(op, f, flat[i], s, small[i], small[i].numel() * ranks, "world size x " + s + "'s elements");
  }
}

void own_block(const char* op, int64_t sends, int64_t expects) {
  TORCH_CHECK_VALUE(sends == expects, "fastpar.", op, ": this rank sends itself ", sends, " bytes but expects ",
                    expects, " from itself");
}

int64_t row_elems(const at::Tensor& t) { return t.dim() == 0 || t.size(0) == 0 ? 0 : t.numel() / t.size(0); }

std::vector<int64_t> all_to_all_split(const char* arg, const std::vector<int64_t>& splits, int64_t rows, int64_t unit,
                                      int ranks) {
  std::vector<int64_t> counts(static_cast<size_t>(ranks));
  if (splits.empty()) {
    TORCH_CHECK_VALUE(rows % ranks == 0, "fastpar.all_to_all_single: ", arg, " has ", rows,
                      " rows, which do not split evenly over ", ranks, " ranks (pass split sizes)");
    for (auto& c : counts) c = rows / ranks * unit;
    return counts;
  }
  TORCH_CHECK_VALUE(int(splits.size()) == ranks, "fastpar.all_to_all_single: ", arg, "_split_sizes has ",
                    splits.size(), " entries but the group has ", ranks, " ranks");
  int64_t sum = 0;
  for (size_t q = 0; q < splits.size(); ++q) {
    TORCH_CHECK_VALUE(splits[q] >= 0, "fastpar.all_to_all_single: ", arg, "_split_sizes[", q, "] is ", splits[q]);
    sum += splits[q];
    counts[q] = splits[q] * unit;
  }
  TORCH_CHECK_VALUE(sum == rows, "fastpar.all_to_all_single: ", arg, "_split_sizes sum to ", sum, " but ", arg,
                    " has ", rows, " rows");
  return counts;
}

std::vector<int64_t> splits(const char* arg, const std::vector<int64_t>& sizes, const at::Tensor& t, int ranks) {
  return all_to_all_split(arg, sizes, t.dim() == 0 ? 1 : t.size(0), row_elems(t), ranks);
}

}  // namespace checks
}  // namespace distributed
}  // namespace fastpar
