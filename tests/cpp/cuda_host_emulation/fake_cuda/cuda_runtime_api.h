// Test-only stand-in for the CUDA runtime, so that the GPU code (kernels and
// the cuda_p2p ring executor) compiles with the host compiler and runs on a
// machine without a GPU. Every "async" call completes immediately, in host
// order: a valid serialization of what the streams would do, because the ring
// executor's events only ever add ordering. Several host threads may act as
// several processes (the IPC test): the state here is thread-local or atomic.
// Only what that code calls is here.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorPeerAccessAlreadyEnabled = 704 };
enum cudaMemcpyKind { cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3 };
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
#define cudaHostAllocMapped 2
struct cudaIpcMemHandle_t {
  char reserved[64];
};
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
#define cudaEventDisableTiming 2

struct uint4 {
  unsigned x, y, z, w;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};

namespace fake_cuda {
inline thread_local int current_device = 0;
inline std::atomic<int64_t> copies{0};  // copies run so far (tests check staging copies happen)
// Event calls so far: the one-stream ring must make none.
inline std::atomic<int64_t> event_calls{0};
inline std::atomic<int64_t> events_created{0};  // cached events: created once per device and concurrent use
// Pinned host allocations not yet freed (the endpoint test counts them) and
// what cudaDeviceSynchronize returns (a test breaks the "device" with it).
inline std::atomic<int64_t> live_host_allocs{0};
inline std::atomic<cudaError_t> sync_result{cudaSuccess};
}  // namespace fake_cuda

inline cudaError_t cudaGetDevice(int* d) {
  *d = fake_cuda::current_device;
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int d) {
  fake_cuda::current_device = d;
  return cudaSuccess;
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  *e = reinterpret_cast<cudaEvent_t>(new int(0));
  ++fake_cuda::event_calls;
  ++fake_cuda::events_created;
  return cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<int*>(e);
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) {
  ++fake_cuda::event_calls;
  return cudaSuccess;
}
inline cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) {
  ++fake_cuda::event_calls;
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t b, cudaMemcpyKind, cudaStream_t) {
  std::memmove(d, s, b);
  ++fake_cuda::copies;
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyPeerAsync(void* d, int, const void* s, int, size_t b, cudaStream_t) {
  std::memmove(d, s, b);
  ++fake_cuda::copies;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr, int) {
  *v = 2;
  return cudaSuccess;
}
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize() { return fake_cuda::sync_result.load(); }
// Pinned, mapped host memory: plain heap memory whose device view is itself.
inline cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) {
  *p = ::operator new(bytes);
  ++fake_cuda::live_host_allocs;
  return cudaSuccess;
}
inline cudaError_t cudaFreeHost(void* p) {
  ::operator delete(p);
  --fake_cuda::live_host_allocs;
  return cudaSuccess;
}
inline cudaError_t cudaHostGetDevicePointer(void** dev, void* host, unsigned) {
  *dev = host;
  return cudaSuccess;
}
