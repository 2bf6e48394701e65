// The Python bindings of the distributed layer, each adding its classes to
// fastpar._C: module.cpp calls register_distributed (and register_cuda_engine
// in CUDA builds), which calls the others. Only the sources that bind include
// this header, and with it pybind11.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace fastpar {
namespace distributed {

// Adds fastpar._C.Engine.
void register_engine(pybind11::module& m);

// Adds fastpar._C.ShmEngine (after fastpar._C.Engine).
void register_shm_engine(pybind11::module& m);

// Adds fastpar._C.HierarchicalEngine.
void register_hierarchical_engine(pybind11::module& m);

// Adds fastpar._C.CudaEngine (CUDA builds only).
void register_cuda_engine(pybind11::module& m);

// Adds fastpar._C.Engine, Backend, ShmEngine, HierarchicalEngine and the
// module's constants.
void register_distributed(pybind11::module& m);

}  // namespace distributed
}  // namespace fastpar
