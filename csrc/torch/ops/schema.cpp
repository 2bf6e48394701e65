// The op schemas, in one place. Implementations: cpu_ops.cpp (CPU) and
// cuda_ops.cpp (CUDA). Python composes the user-facing API (fastpar/comm.py)
// from these primitives; every one of them checks its arguments first.
#include <torch/library.h>

TORCH_LIBRARY(fastpar, m) {
  // In place: every tensor ends holding op over all of them, bitwise identical.
  // algorithm: "auto" | "direct" | "ring".
  m.def("allreduce_(Tensor(a!)[] tensors, int op, str algorithm) -> ()");
  // output = op over inputs; output may be inputs[root] itself.
  m.def("reduce_(Tensor[] inputs, Tensor(a!) output, int op) -> ()");
  // outputs[i] = op over inputs of their i-th slice (inputs[j].numel == n * outputs[i].numel).
  m.def("reduce_scatter_(Tensor[] inputs, Tensor(a!)[] outputs, int op) -> ()");
  // outputs[j] = concatenation of all inputs (outputs[j].numel == n * inputs[i].numel).
  m.def("allgather_(Tensor[] inputs, Tensor(a!)[] outputs) -> ()");
  // outputs[j] = src for every j.
  m.def("broadcast_(Tensor src, Tensor(a!)[] outputs) -> ()");
  // dsts[i] = srcs[i]: the pairwise copies behind scatter and gather (views allowed).
  m.def("copy_many_(Tensor[] srcs, Tensor(a!)[] dsts) -> ()");
}
