// call_range.h's CUDA part: NVTX ranges and a profiler range that ends on the
// call's stream.
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExt.h>

#include "call_range.h"

namespace fastpar {
namespace distributed {

namespace {

// A host function on the call's stream: runs once the GPU has done the work
// queued before it, and drops the range it holds (no CUDA calls here).
void CUDART_CB drop_range(void* held) { delete static_cast<std::shared_ptr<CallRange::Range>*>(held); }

}  // namespace

void nvtx_push(const char* name) { nvtxRangePushA(name); }
void nvtx_pop() { nvtxRangePop(); }

void end_on_stream(const at::Tensor& t, std::shared_ptr<CallRange::Range> range) {
  auto* held = new std::shared_ptr<CallRange::Range>(std::move(range));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(t.get_device()).stream();
  if (cudaLaunchHostFunc(stream, drop_range, held) == cudaSuccess) return;
  cudaGetLastError();  // a stream that is capturing a graph, say: the range ends now
  delete held;
}

}  // namespace distributed
}  // namespace fastpar
