// Error plumbing for the torch-free CUDA transports: every function returns the
// first cudaError_t it meets, and the torch glue turns it into an exception
// with C10_CUDA_CHECK (which adds the error string and the call site).
#pragma once

#include <cuda_runtime_api.h>

#include <optional>

#define FASTPAR_CUDA_TRY(expr)                 \
  do {                                         \
    const cudaError_t fastpar_err_ = (expr);   \
    if (fastpar_err_ != cudaSuccess) return fastpar_err_; \
  } while (0)

namespace fastpar {
namespace cuda_p2p {

// Whether `device`'s primary context exists: 1 yes, 0 no, -1 the driver
// cannot say. The runtime API has no such query, so this asks the driver's
// cuDevicePrimaryCtxGetState through the runtime's entry-point lookup (no
// link against libcuda, and no torch: c10's hasPrimaryContext does the same
// through NVRTC's driver bindings). Neither call makes a context. The driver
// takes the ordinal as its CUdevice, as c10 passes it.
inline int primary_context_state(int device) {
  using GetState = int (*)(int dev, unsigned int* flags, int* active);  // CUresult (CUdevice, unsigned*, int*)
  static const GetState get_state = [] {
    void* fn = nullptr;
#if defined(CUDART_VERSION) && CUDART_VERSION >= 12050
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      fn = nullptr;
#elif defined(CUDART_VERSION) && CUDART_VERSION >= 12000
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPoint("cuDevicePrimaryCtxGetState", &fn, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      fn = nullptr;
#endif
    // Before CUDA 12 cudaSetDevice makes no context, so "cannot say" is safe.
    if (fn == nullptr) cudaGetLastError();  // not sticky: keep it from surfacing in a later launch check
    return reinterpret_cast<GetState>(fn);
  }();
  if (get_state == nullptr) return -1;
  unsigned int flags = 0;
  int active = 0;
  if (get_state(device, &flags, &active) != 0) return -1;
  return active != 0 ? 1 : 0;
}

// Restores the calling thread's current device on scope exit: transports hop
// between devices (a kernel must be launched with its stream's device current)
// and must leave the caller's device as they found it. But not at any price:
// since CUDA 12 cudaSetDevice makes the device's primary context (~0.5 GiB),
// and a thread that never chose a device reads 0 from cudaGetDevice. Setting
// that 0 back would give every rank on another GPU a context on GPU 0 (at
// destroy_process_group, from a thread that never touched GPU 0). So, as
// c10's device guard (MaybeSetDevice), it restores only a device that is not
// current already and whose primary context exists. A device without one was
// never chosen (cudaSetDevice would have made it), only defaulted to, so the
// thread keeps the transport's device current instead.
class DeviceRestore {
 public:
  DeviceRestore() { saved_ok_ = cudaGetDevice(&saved_) == cudaSuccess; }
  ~DeviceRestore() {
    if (!saved_ok_) return;
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now == saved_) return;
    // -1 (the driver cannot say): restore, as before CUDA 12 (no context is made there).
    if (primary_context_state(saved_) == 0) return;
    cudaSetDevice(saved_);
  }
  DeviceRestore(const DeviceRestore&) = delete;
  DeviceRestore& operator=(const DeviceRestore&) = delete;

 private:
  int saved_ = 0;
  bool saved_ok_ = false;
};

// Makes `device` current for the scope and restores the caller's afterwards
// (DeviceRestore's rules), touching the runtime only when they differ: a call
// made on its communicator's device, the common case, costs one cudaGetDevice
// and no cudaSetDevice. error(): the switch's error, if one was needed.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now == device) return;
    restore_.emplace();
    err_ = cudaSetDevice(device);
  }
  cudaError_t error() const { return err_; }

 private:
  std::optional<DeviceRestore> restore_;
  cudaError_t err_ = cudaSuccess;
};

}  // namespace cuda_p2p
}  // namespace fastpar
