// One device-to-device copy between GPUs of this process, enqueued on `stream`
// (a stream of either device; the caller's events order it).
//
// cudaMemcpyPeerAsync works whether or not peer access is enabled: with it, the
// copy engines move the bytes directly over NVLink / PCIe P2P; without it, the
// driver stages them through host memory. Either way the bytes are the same.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace fastpar {
namespace cuda_p2p {

inline cudaError_t peer_copy(void* dst, int dst_device, const void* src, int src_device, size_t bytes,
                             cudaStream_t stream) {
  if (bytes == 0 || (dst == src && dst_device == src_device)) return cudaSuccess;
  if (dst_device == src_device) return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
  return cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, stream);
}

}  // namespace cuda_p2p
}  // namespace fastpar
