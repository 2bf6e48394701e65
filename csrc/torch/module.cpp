// The Python module fastpar._C: importing it registers the torch.ops.fastpar
// ops (schema.cpp and the per-device files here) and the torch.distributed
// backend (distributed/), and exposes build facts and knobs.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/extension.h>

#include "../core/executors/cpu_shm/shm_collectives.h"
#include "../core/kernels/cpu_isa.h"
#include "distributed/backend.h"
#include "distributed/bindings.h"
#include "distributed/knobs.h"
#include "ops/tuning.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "fastpar collective kernels (CPU, and CUDA when built with it)";
#ifdef FASTPAR_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
  // fastpar.allreduce's call of torch.ops.fastpar.allreduce_ without the
  // Python side of torch.ops (the overload lookup and boxing, a large part of
  // a small call), through the same dispatcher entry, so every device,
  // dispatch key and check is the op's.
  m.def(
      "_allreduce_",
      [](const std::vector<at::Tensor>& tensors, int64_t op, const std::string& algorithm) {
        static const auto handle = c10::Dispatcher::singleton()
                                       .findSchemaOrThrow("fastpar::allreduce_", "")
                                       .typed<void(at::TensorList, int64_t, c10::string_view)>();
        handle.call(tensors, op, algorithm);
      },
      py::arg("tensors"), py::arg("op"), py::arg("algorithm"), py::call_guard<py::gil_scoped_release>());
  // The test hooks: what tests and benchmarks flip to reach a form the
  // defaults do not take.
  py::module_ testing = m.def_submodule("_testing", "Test hooks; not an interface.");
  testing.def("set_ring_segment_bytes", [](int64_t b) {
    TORCH_CHECK_VALUE(b >= 64, "ring segment bytes must be >= 64, got ", b);
    fastpar::ops::tuning().ring_segment_bytes = b;
  });
  testing.def("ring_segment_bytes", [] { return fastpar::ops::tuning().ring_segment_bytes; });
  // The one-GPU list ring in one launch (true) or one launch per segment.
  testing.def("set_ring_one_launch", [](bool on) { fastpar::ops::tuning().ring_one_launch = on; });
  testing.def("ring_one_launch", [] { return fastpar::ops::tuning().ring_one_launch; });
  // The CUDA list ops' device model (tuning.h, DeviceModel): "real", or a
  // test model that takes every entry on one GPU to be on a GPU of its own.
  testing.def("set_list_device_model", [](const std::string& model) {
    fastpar::ops::tuning().device_model = fastpar::ops::device_model_from(model);
  });
  testing.def("list_device_model",
              [] { return std::string(fastpar::ops::device_model_name(fastpar::ops::tuning().device_model)); });
  m.def("_list_op_paths", [] {
    const auto& p = fastpar::ops::list_op_paths();
    py::dict d;
    d["allreduce_one_launch"] = p.allreduce_one_launch.load();
    d["allreduce_direct"] = p.allreduce_direct.load();
    d["allreduce_ring"] = p.allreduce_ring.load();
    d["staging_buffers"] = p.staging_buffers.load();
    return d;
  });
  // The CPU reduce loops' instruction set (docs/measurements.md): the one in
  // use (FASTPAR_CPU_ISA or the best supported) and the best this CPU has.
  fastpar::distributed::apply_cpu_isa_knob();
  m.def("cpu_isa", [] { return std::string(fastpar::cpu_isa_name(fastpar::cpu_isa())); });
  m.def("cpu_isa_supported", [] { return std::string(fastpar::cpu_isa_name(fastpar::cpu_isa_supported())); });
  // Calls that took the zero-copy schedule of registered CPU buffers, in this
  // process (the tests check it ran: its results equal the copying schedules').
  m.def("_shm_registered_allreduce_calls", [] { return fastpar::cpu_shm::registered_allreduce_calls(); });
  fastpar::distributed::register_distributed(m);
#ifdef FASTPAR_WITH_CUDA
  fastpar::distributed::register_cuda_engine(m);
#endif
}
