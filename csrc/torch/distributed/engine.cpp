#include "engine.h"

#include <ATen/core/ivalue.h>

#include <optional>

#include "bindings.h"

namespace fastpar {
namespace distributed {

Work enqueued_work(std::vector<at::Tensor> outputs) {
  std::vector<c10::Device> devices;
  if (!outputs.empty() && !outputs[0].is_cpu()) devices.push_back(outputs[0].device());
  auto fut = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
  fut->markCompleted(c10::IValue(outputs));
  return c10d::Work::create_from_future(fut);
}

// Every step's Work is waited before the next starts: on the CPU the step has
// finished; on a GPU wait() only orders the caller's stream after it, so the
// whole call is still enqueued without blocking the host.
void Engine::all_reduce_now(at::Tensor& t, const Call& c) { all_reduce(t, c)->wait(); }

Work Engine::all_reduce_coalesced(std::vector<at::Tensor>& ts, const Call& c) {
  for (at::Tensor& t : ts) all_reduce(t, c)->wait();
  return enqueued_work(ts);
}

Work Engine::all_gather_into(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins, const Call& c) {
  for (size_t i = 0; i < ins.size(); ++i) {
    std::vector<at::Tensor> blocks;
    for (int r = 0; r < size(); ++r) blocks.push_back(rank_block(outs[i], ins[i].numel(), r));
    all_gather(blocks, ins[i], c)->wait();
  }
  return enqueued_work(outs);
}

at::Tensor Engine::registered_empty(const std::vector<int64_t>&, at::ScalarType, int) {
  TORCH_CHECK_VALUE(false, "fastpar.registered_empty: this group's ranks are on several hosts; registered tensors "
                    "live in one host's shared memory or CUDA IPC arena");
}

bool Engine::is_registered(const at::Tensor&) const { return false; }

void call_without_gil(const std::function<void()>& f) {
  std::optional<pybind11::gil_scoped_release> no_gil;
  if (Py_IsInitialized() && PyGILState_Check()) no_gil.emplace();
  f();
}

void register_engine(pybind11::module& m) {
  namespace py = pybind11;
  py::class_<Engine, c10::intrusive_ptr<Engine>>(m, "Engine", R"(
One of fastpar's engines, which run the calls the group's fastpar._C.Backend
has checked: ShmEngine, CudaEngine, HierarchicalEngine, C10dEngine.)")
      .def("rank", &Engine::rank)
      .def("size", &Engine::size);
}

}  // namespace distributed
}  // namespace fastpar
