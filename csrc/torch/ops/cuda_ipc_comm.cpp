// torch.classes.fastpar.CudaIpcComm: one process's end of a multi-process CUDA
// IPC communicator (transport/cuda_ipc), one GPU per process.
//
// Rendezvous is the caller's: every rank constructs one, publishes handle()
// (64 bytes) through its Store, and passes all ranks' handles, stacked in rank
// order, to connect(). From then on allreduce_ enqueues on the current stream
// of the tensor's device and never blocks the host; status() synchronizes that
// stream and reports a failed flag wait (timeout, peer abort, peers in a
// different call) as an exception.
//
// Collective rules: every rank calls allreduce_ in the same order with the same
// numel, dtype, op and algorithm; close() must follow a barrier, since peers
// map this rank's arena until they close theirs. Dropped without close(), the
// communicator leaves its arena to the driver (freed at process exit).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cstring>
#include <string>
#include <vector>

#include "../../core/executors/cuda_ipc/ipc_allreduce.h"
#include "../../core/transport/cuda_ipc/ipc_endpoint.h"
#include "../../core/executors/cuda_ipc/preload_kernels.h"
#include "checks.h"

namespace fastpar {
namespace ops {
namespace {

// The kernels, loaded before the handle exchange (cuda_ipc/preload_kernels.h says why).
void load_kernels(int64_t device) {
  c10::cuda::CUDAGuard guard{c10::DeviceIndex(device)};
  const char* what = "";
  const cudaError_t err = cuda_ipc::preload_ipc_kernels(&what);
  TORCH_CHECK(err == cudaSuccess, "fastpar.CudaIpcComm: could not load the ", what, " kernels on cuda:", device,
              " (CUDA error: ", cudaGetErrorString(err), "); a build of fastpar without this GPU's architecture "
              "gives 'no kernel image is available'");
}

class CudaIpcComm : public torch::CustomClassHolder {
 public:
  CudaIpcComm(int64_t rank, int64_t size, int64_t device, int64_t slot_bytes) {
    TORCH_CHECK_VALUE(size >= 1 && size <= cuda_ipc::kMaxIpcRanks, "fastpar.CudaIpcComm: size is ", size,
                      " but must be between 1 and ", cuda_ipc::kMaxIpcRanks);
    TORCH_CHECK_VALUE(rank >= 0 && rank < size, "fastpar.CudaIpcComm: rank is ", rank,
                      " but must be in [0, ", size, ")");
    TORCH_CHECK_VALUE(device >= 0, "fastpar.CudaIpcComm: device is ", device, " but must be a CUDA device index");
    TORCH_CHECK_VALUE(slot_bytes >= 64, "fastpar.CudaIpcComm: slot_bytes is ", slot_bytes,
                      " but must be >= 64");
    load_kernels(device);
    C10_CUDA_CHECK(ep_.create(int(rank), int(size), int(device), size_t(slot_bytes)));
  }

  // ~IpcEndpoint unmaps, and frees the arena only if its handle never left
  // this process: peers may still read it, so without close() (after its
  // barrier) it is left to the driver.

  at::Tensor handle() {
    TORCH_CHECK(ep_.created(), "fastpar.CudaIpcComm: handle() after close()");
    cudaIpcMemHandle_t h;
    C10_CUDA_CHECK(ep_.export_handle(&h));
    at::Tensor out = at::empty({int64_t(sizeof(h))}, at::kByte);
    std::memcpy(out.data_ptr(), &h, sizeof(h));
    return out;
  }

  void connect(const at::Tensor& handles) {
    TORCH_CHECK(!ep_.connected(), "fastpar.CudaIpcComm: connect() called twice");
    TORCH_CHECK(ep_.created(), "fastpar.CudaIpcComm: connect() after close()");
    const int size = ep_.comm().size;
    TORCH_CHECK_VALUE(handles.device().is_cpu() && handles.scalar_type() == at::kByte && handles.dim() == 2 &&
                          handles.size(0) == size && handles.size(1) == int64_t(sizeof(cudaIpcMemHandle_t)),
                      "fastpar.CudaIpcComm.connect: handles must be a CPU uint8 tensor of shape [", size,
                      ", ", sizeof(cudaIpcMemHandle_t), "], got ", handles.scalar_type(), " ", handles.sizes(),
                      " on '", handles.device().str(), "'");
    const at::Tensor h = handles.contiguous();
    std::vector<cudaIpcMemHandle_t> hs(static_cast<size_t>(size));
    std::memcpy(hs.data(), h.data_ptr<uint8_t>(), hs.size() * sizeof(cudaIpcMemHandle_t));
    C10_CUDA_CHECK(ep_.connect(hs.data()));
  }

  void allreduce_(const at::Tensor& t, int64_t op, const std::string& algorithm) {
    TORCH_CHECK(ep_.connected(), "fastpar.CudaIpcComm.allreduce_: connect() first");
    cuda_ipc::IpcComm& c = ep_.comm();
    TORCH_CHECK(c.enqueue_error == cudaSuccess, enqueue_failure("CudaIpcComm.allreduce_", /*earlier=*/true));
    TORCH_CHECK_VALUE(t.is_cuda() && t.get_device() == c.device, "fastpar.CudaIpcComm.allreduce_: tensor is on '",
                      t.device().str(), "' but this rank's device is 'cuda:", c.device, "'");
    TORCH_CHECK_VALUE(t.is_contiguous(), "fastpar.CudaIpcComm.allreduce_: tensor must be contiguous, but it has sizes ",
                      t.sizes(), " and strides ", t.strides(), " (call .contiguous() first)");
    const ReduceOp rop = to_reduce_op("CudaIpcComm.allreduce_", op);
    check_op_dtype("CudaIpcComm.allreduce_", rop, "tensor", t);
    TORCH_CHECK_VALUE(algorithm == "auto" || algorithm == "one_shot" || algorithm == "two_shot",
                      "fastpar.CudaIpcComm.allreduce_: algorithm is '", algorithm,
                      "' but must be 'auto', 'one_shot' or 'two_shot'");
    if (t.numel() == 0 || c.size == 1) return;
    const DType dt = to_dtype("CudaIpcComm.allreduce_", "tensor", t.scalar_type());
    const bool one_shot =
        algorithm == "one_shot" || (algorithm == "auto" && cuda_ipc::prefer_one_shot(int64_t(t.nbytes()), c));
    c10::cuda::CUDAGuard guard(t.device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(t.get_device()).stream();
    // Its phase numbers and slots come from host counters at enqueue, which a
    // replay would repeat (the process group's graphed all_reduce has none).
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    TORCH_CHECK_VALUE(capture == cudaStreamCaptureStatusNone, "fastpar.CudaIpcComm.allreduce_: cannot be captured in "
                      "a CUDA graph (its steps are numbered by the host at enqueue); dist.all_reduce on a fastpar "
                      "group can be");
    const cudaError_t err =
        one_shot ? cuda_ipc::allreduce_one_shot(c, dt, rop, t.const_data_ptr(), t.data_ptr(), t.numel(), stream)
                 : cuda_ipc::allreduce_two_shot(c, dt, rop, t.const_data_ptr(), t.data_ptr(), t.numel(), stream);
    // A step that could not be enqueued has made the communicator unusable
    // (ipc_steps.h, fail_enqueue): say so rather than name the CUDA error alone.
    TORCH_CHECK(err == cudaSuccess || c.enqueue_error == cudaSuccess,
                enqueue_failure("CudaIpcComm.allreduce_", /*earlier=*/false));
    C10_CUDA_CHECK(err);
  }

  // Synchronizes the current stream; raises if a flag wait failed.
  void check() {
    TORCH_CHECK(ep_.created(), "fastpar.CudaIpcComm: check() after close()");
    const cuda_ipc::IpcComm& c = ep_.comm();
    // Its own abort word makes the status read "a peer aborted": the cause is here.
    TORCH_CHECK(c.enqueue_error == cudaSuccess, enqueue_failure("CudaIpcComm.allreduce", /*earlier=*/true));
    c10::cuda::CUDAGuard guard{c10::DeviceIndex(c.device)};
    uint32_t s = 0;
    C10_CUDA_CHECK(cuda_ipc::read_status(c, c10::cuda::getCurrentCUDAStream(c.device).stream(), &s));
    if (s == 0) return;
    cuda_ipc::FailureFacts f;
    f.status = s;
    ep_.mismatch(&f.mismatch_peer, &f.mine, &f.theirs);
    TORCH_CHECK(false, cuda_ipc::failure_message("CudaIpcComm.allreduce", c.rank, f,
                                                 int64_t(c.timeout_ns / 1000000)));
  }

  // Waits for all work on this rank's device (every stream): after it, this
  // rank no longer reads peers' arenas.
  void synchronize() {
    c10::cuda::CUDAGuard guard{c10::DeviceIndex(ep_.comm().device)};
    C10_CUDA_CHECK(cudaDeviceSynchronize());
  }

  int64_t device() const { return ep_.comm().device; }

  // Must follow a barrier with the peers (fastpar.cuda_ipc.close does one).
  void close() {
    C10_CUDA_CHECK(ep_.disconnect());
    C10_CUDA_CHECK(ep_.free_arena());
  }

 private:
  std::string enqueue_failure(const char* op, bool earlier) const {
    return cuda_ipc::enqueue_failure_message(op, ep_.comm().rank, ep_.comm().enqueue_error, earlier) +
           "; close it (fastpar.cuda_ipc.close) on every rank and connect a new one";
  }

  cuda_ipc::IpcEndpoint ep_;
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(fastpar, m) {
  m.class_<CudaIpcComm>("CudaIpcComm")
      .def(torch::init<int64_t, int64_t, int64_t, int64_t>())
      .def("handle", &CudaIpcComm::handle)
      .def("connect", &CudaIpcComm::connect)
      .def("allreduce_", &CudaIpcComm::allreduce_)
      .def("check", &CudaIpcComm::check)
      .def("synchronize", &CudaIpcComm::synchronize)
      .def("device", &CudaIpcComm::device)
      .def("close", &CudaIpcComm::close);
}

}  // namespace ops
}  // namespace fastpar
