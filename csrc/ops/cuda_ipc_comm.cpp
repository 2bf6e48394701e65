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
// numel, dtype, op and algorithm; close() (and so destruction) must follow a
// barrier, since peers map this rank's arena until they close theirs.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cstring>
#include <string>

#include "../transport/cuda_ipc/allreduce_ipc.h"
#include "../transport/cuda_ipc/ipc_handles.h"
#include "checks.h"

namespace fastpar {
namespace ops {
namespace {

// One-shot below this size: its latency is one phase, two-shot's is two, and
// below ~256 KiB latency, not bandwidth, decides (vLLM's custom allreduce
// draws the line in the same region for 2-8 GPUs).
constexpr int64_t kOneShotMaxBytes = 256 * 1024;

const char* status_text(uint32_t s) {
  switch (flags::WaitStatus(s)) {
    case flags::WaitStatus::kOk: return "ok";
    case flags::WaitStatus::kTimeout: return "timed out waiting for a peer's flag";
    case flags::WaitStatus::kPeerAborted: return "a peer aborted";
    case flags::WaitStatus::kPeerDead: return "a peer died";
    case flags::WaitStatus::kMismatch:
      return "peers are in a different call (op, numel, dtype or algorithm differ)";
  }
  return "unknown failure";
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
    c_.rank = int(rank);
    c_.size = int(size);
    c_.device = int(device);
    c_.slot_bytes = size_t(slot_bytes);
    c10::cuda::CUDAGuard guard{c10::DeviceIndex(device)};
    void* base = nullptr;
    C10_CUDA_CHECK(cuda_ipc::arena_alloc(c_.slot_bytes, &base));
    c_.bases[c_.rank] = base;
  }

  ~CudaIpcComm() override {
    // Errors cannot leave a destructor; close() reports them when called directly.
    try {
      close();
    } catch (...) {
    }
  }

  at::Tensor handle() {
    TORCH_CHECK(c_.bases[c_.rank], "fastpar.CudaIpcComm: handle() after close()");
    cudaIpcMemHandle_t h;
    c10::cuda::CUDAGuard guard{c10::DeviceIndex(c_.device)};
    C10_CUDA_CHECK(cuda_ipc::export_handle(c_.bases[c_.rank], &h));
    at::Tensor out = at::empty({int64_t(sizeof(h))}, at::kByte);
    std::memcpy(out.data_ptr(), &h, sizeof(h));
    return out;
  }

  void connect(const at::Tensor& handles) {
    TORCH_CHECK(!connected_, "fastpar.CudaIpcComm: connect() called twice");
    TORCH_CHECK_VALUE(handles.device().is_cpu() && handles.scalar_type() == at::kByte && handles.dim() == 2 &&
                          handles.size(0) == c_.size && handles.size(1) == int64_t(sizeof(cudaIpcMemHandle_t)),
                      "fastpar.CudaIpcComm.connect: handles must be a CPU uint8 tensor of shape [", c_.size,
                      ", ", sizeof(cudaIpcMemHandle_t), "], got ", handles.scalar_type(), " ", handles.sizes(),
                      " on '", handles.device().str(), "'");
    const at::Tensor h = handles.contiguous();
    c10::cuda::CUDAGuard guard{c10::DeviceIndex(c_.device)};
    for (int q = 0; q < c_.size; ++q) {
      if (q == c_.rank) continue;
      cudaIpcMemHandle_t hq;
      std::memcpy(&hq, h.data_ptr<uint8_t>() + q * int64_t(sizeof(hq)), sizeof(hq));
      C10_CUDA_CHECK(cuda_ipc::open_handle(hq, &c_.bases[q]));
    }
    connected_ = true;
  }

  void allreduce_(const at::Tensor& t, int64_t op, const std::string& algorithm) {
    TORCH_CHECK(connected_, "fastpar.CudaIpcComm.allreduce_: connect() first");
    TORCH_CHECK_VALUE(t.is_cuda() && t.get_device() == c_.device, "fastpar.CudaIpcComm.allreduce_: tensor is on '",
                      t.device().str(), "' but this rank's device is 'cuda:", c_.device, "'");
    TORCH_CHECK_VALUE(t.is_contiguous(), "fastpar.CudaIpcComm.allreduce_: tensor must be contiguous, but it has sizes ",
                      t.sizes(), " and strides ", t.strides(), " (call .contiguous() first)");
    const ReduceOp rop = to_reduce_op("CudaIpcComm.allreduce_", op);
    check_op_dtype("CudaIpcComm.allreduce_", rop, "tensor", t);
    TORCH_CHECK_VALUE(algorithm == "auto" || algorithm == "one_shot" || algorithm == "two_shot",
                      "fastpar.CudaIpcComm.allreduce_: algorithm is '", algorithm,
                      "' but must be 'auto', 'one_shot' or 'two_shot'");
    if (t.numel() == 0 || c_.size == 1) return;
    const DType dt = to_dtype("CudaIpcComm.allreduce_", "tensor", t.scalar_type());
    const bool one_shot = algorithm == "one_shot" ||
                          (algorithm == "auto" && int64_t(t.nbytes()) <= std::min<int64_t>(kOneShotMaxBytes,
                                                                                             int64_t(c_.slot_bytes)));
    c10::cuda::CUDAGuard guard(t.device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(t.get_device()).stream();
    if (one_shot) {
      C10_CUDA_CHECK(cuda_ipc::allreduce_one_shot(c_, dt, rop, t.const_data_ptr(), t.data_ptr(), t.numel(), stream));
    } else {
      C10_CUDA_CHECK(cuda_ipc::allreduce_two_shot(c_, dt, rop, t.const_data_ptr(), t.data_ptr(), t.numel(), stream));
    }
  }

  // Synchronizes the current stream; raises if a flag wait failed.
  void check() {
    TORCH_CHECK(c_.bases[c_.rank], "fastpar.CudaIpcComm: check() after close()");
    c10::cuda::CUDAGuard guard{c10::DeviceIndex(c_.device)};
    uint32_t s = 0;
    C10_CUDA_CHECK(cuda_ipc::read_status(c_, c10::cuda::getCurrentCUDAStream(c_.device).stream(), &s));
    TORCH_CHECK(s == 0, "fastpar.CudaIpcComm (rank ", c_.rank, "): a collective failed: ", status_text(s),
                "; this communicator is unusable, create a new one");
  }

  // Waits for all work on this rank's device (every stream): after it, this
  // rank no longer reads peers' arenas.
  void synchronize() {
    c10::cuda::CUDAGuard guard{c10::DeviceIndex(c_.device)};
    C10_CUDA_CHECK(cudaDeviceSynchronize());
  }

  int64_t device() const { return c_.device; }

  void close() {
    if (!c_.bases[c_.rank]) return;
    c10::cuda::CUDAGuard guard{c10::DeviceIndex(c_.device)};
    // Work enqueued on any stream may still read the mappings or the arena.
    C10_CUDA_CHECK(cudaDeviceSynchronize());
    for (int q = 0; q < c_.size; ++q) {
      if (q == c_.rank || !c_.bases[q]) continue;
      C10_CUDA_CHECK(cuda_ipc::close_handle(c_.bases[q]));
      c_.bases[q] = nullptr;
    }
    void* own = c_.bases[c_.rank];
    c_.bases[c_.rank] = nullptr;
    connected_ = false;
    C10_CUDA_CHECK(cuda_ipc::arena_free(own));
  }

 private:
  cuda_ipc::IpcComm c_;
  bool connected_ = false;
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
