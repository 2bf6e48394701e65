// The torch layer's words for dtypes and arguments, shared by the list ops
// (ops/) and the torch.distributed backend (distributed/), so both name a
// dtype or an argument the same way, and the element math's DType for each
// torch dtype it reduces.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "../core/kernels/reduce_ops.h"

namespace fastpar {

// Python's spelling (torch.float16), not c10's (Half): users read these.
inline std::string dtype_str(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "torch.float32";
    case at::kDouble: return "torch.float64";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kChar: return "torch.int8";
    case at::kByte: return "torch.uint8";
    case at::kShort: return "torch.int16";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    case at::kBool: return "torch.bool";
    case at::kComplexFloat: return "torch.complex64";
    case at::kComplexDouble: return "torch.complex128";
    default: return std::string("torch.") + c10::toString(t);
  }
}

// The dtype as the element math knows it; nullopt for dtypes fastpar does not reduce.
inline std::optional<DType> maybe_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::F32;
    case at::kDouble: return DType::F64;
    case at::kHalf: return DType::F16;
    case at::kBFloat16: return DType::BF16;
    case at::kChar: return DType::I8;
    case at::kByte: return DType::U8;
    case at::kInt: return DType::I32;
    case at::kLong: return DType::I64;
    default: return std::nullopt;
  }
}

// The same, throwing TypeError (naming `op` and `arg_index`) for dtypes fastpar does not reduce.
inline DType to_dtype(const char* op, const std::string& arg_index, at::ScalarType t) {
  const std::optional<DType> d = maybe_dtype(t);
  TORCH_CHECK_TYPE(d.has_value(), "fastpar.", op, ": ", arg_index, " has dtype ", dtype_str(t),
                   ", which fastpar does not support (supported: float32, float64, float16, "
                   "bfloat16, int8, uint8, int32, int64)");
  return *d;
}

// An argument's entry, as messages name it: "tensors[1]".
inline std::string indexed(const std::string& arg, size_t i) { return arg + "[" + std::to_string(i) + "]"; }

}  // namespace fastpar
