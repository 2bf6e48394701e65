// Error plumbing for the torch-free CUDA transports: every function returns the
// first cudaError_t it meets, and the torch glue turns it into an exception
// with C10_CUDA_CHECK (which adds the error string and the call site).
#pragma once

#include <cuda_runtime_api.h>

#define FASTPAR_CUDA_TRY(expr)                 \
  do {                                         \
    const cudaError_t fastpar_err_ = (expr);   \
    if (fastpar_err_ != cudaSuccess) return fastpar_err_; \
  } while (0)

namespace fastpar {
namespace cuda_p2p {

// Restores the calling thread's current device on scope exit: transports hop
// between devices (a kernel must be launched with its stream's device current)
// and must leave the caller's device as they found it.
class DeviceRestore {
 public:
  DeviceRestore() { saved_ok_ = cudaGetDevice(&saved_) == cudaSuccess; }
  ~DeviceRestore() {
    if (saved_ok_) cudaSetDevice(saved_);
  }
  DeviceRestore(const DeviceRestore&) = delete;
  DeviceRestore& operator=(const DeviceRestore&) = delete;

 private:
  int saved_ = 0;
  bool saved_ok_ = false;
};

}  // namespace cuda_p2p
}  // namespace fastpar
