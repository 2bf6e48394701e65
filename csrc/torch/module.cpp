// The Python module fastpar._C: importing it registers the torch.ops.fastpar
// ops (schema.cpp and the per-device files here) and the torch.distributed
// backends (csrc/backends/), and exposes build facts and knobs.
#include <torch/extension.h>

#include "distributed/hierarchical_backend.h"
#include "distributed/shm_backend.h"
#include "ops/tuning.h"
#ifdef FASTPAR_WITH_CUDA
#include "distributed/cuda_backend.h"
#endif

namespace fastpar {
namespace ops {
Tuning& tuning() {
  static Tuning t;
  return t;
}
}  // namespace ops
}  // namespace fastpar

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "fastpar collective kernels (CPU, and CUDA when built with it)";
#ifdef FASTPAR_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
  m.def("_set_ring_segment_bytes", [](int64_t b) {
    TORCH_CHECK_VALUE(b >= 64, "ring segment bytes must be >= 64, got ", b);
    fastpar::ops::tuning().ring_segment_bytes = b;
  });
  m.def("_get_ring_segment_bytes", [] { return fastpar::ops::tuning().ring_segment_bytes; });
  fastpar::distributed::register_distributed(m);
  fastpar::distributed::register_hierarchical_backend(m);
#ifdef FASTPAR_WITH_CUDA
  fastpar::distributed::register_cuda_backend(m);
#endif
}
