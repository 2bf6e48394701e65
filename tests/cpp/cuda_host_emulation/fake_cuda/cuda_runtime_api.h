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

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorPeerAccessAlreadyEnabled = 704
};
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3 };
// The entry-point lookup of CUDA 12.5+ (cuda_try.h asks it for the driver's
// cuDevicePrimaryCtxGetState).
#define CUDART_VERSION 13000
enum cudaDriverEntryPointQueryResult { cudaDriverEntryPointSuccess = 0, cudaDriverEntryPointSymbolNotFound = 1 };
#define cudaEnableDefault 0x0
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
#define cudaHostAllocMapped 2
struct cudaIpcMemHandle_t {
  char reserved[64];
};
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
#define cudaEventDisableTiming 2
#define cudaStreamNonBlocking 1

struct uint4 {
  unsigned x, y, z, w;
};
struct uint2 {
  unsigned x, y;
};
// The fused loops count which loop ran (executors/cuda_ipc/fused_loops.h).
#define FASTPAR_COUNT_FUSED_LOOPS 1
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};

namespace fake_cuda {
inline thread_local int current_device = 0;
inline std::atomic<int64_t> copies{0};  // copies run so far (tests check staging copies happen)
// Event calls so far: the one-stream ring must make none.
inline std::atomic<int64_t> event_calls{0};
inline std::atomic<int64_t> events_created{0};  // cached events: created once per device and concurrent use
// Streams are tokens (work runs when it is enqueued); the cache test counts them.
inline std::atomic<int64_t> streams_created{0};
// Pinned host allocations not yet freed (the endpoint test counts them) and
// what cudaDeviceSynchronize returns (a test breaks the "device" with it).
inline std::atomic<int64_t> live_host_allocs{0};
inline std::atomic<cudaError_t> sync_result{cudaSuccess};
// The calling thread's last non-sticky error, which cudaGetLastError returns
// and clears; a test sets it to stand for one that other code left behind.
inline thread_local cudaError_t last_error = cudaSuccess;
// Launch failure injection, per thread (a thread is a rank): the emulated
// launchers count their launches and refuse the fail_launch_at-th (1-based;
// 0: none) with cudaErrorLaunchOutOfResources, as a real launch does:
// through cudaGetLastError, the kernel never running.
inline thread_local int64_t launches = 0;
inline thread_local int64_t fail_launch_at = 0;
// What the calling thread (a rank) enqueued on streams: each one costs a
// host-side launch or copy call and a slot in the stream, several
// microseconds on a GPU whatever its size, so a schedule's operation count
// per call is its latency floor (stream_ops_test asserts the counts).
// `bytes` is what the enqueued kernels and copies read plus write in device
// memory, as the emulated launchers compute it from their arguments (flags
// and descriptors not counted).
struct StreamOps {
  int64_t launches = 0;   // kernels
  int64_t memcpys = 0;    // cudaMemcpyAsync / cudaMemcpyPeerAsync
  int64_t event_ops = 0;  // cudaEventRecord / cudaStreamWaitEvent
  int64_t bytes = 0;
  int64_t total() const { return launches + memcpys + event_ops; }
};
inline thread_local StreamOps stream_ops;
inline bool launch_refused() {
  if (++launches != fail_launch_at) {
    ++stream_ops.launches;
    return false;
  }
  last_error = cudaErrorLaunchOutOfResources;
  return true;
}
// Devices whose primary context exists (bit d): cudaSetDevice makes it, as
// from CUDA 12 on. A thread that never set its device reads 0.
inline std::atomic<uint64_t> primary_contexts{0};
inline std::atomic<int64_t> set_device_calls{0};
inline int primary_ctx_get_state(int dev, unsigned int* flags, int* active) {
  *flags = 0;
  *active = int((primary_contexts.load() >> dev) & 1u);
  return 0;
}
}  // namespace fake_cuda

inline cudaError_t cudaGetDevice(int* d) {
  *d = fake_cuda::current_device;
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int d) {
  fake_cuda::current_device = d;
  fake_cuda::primary_contexts |= uint64_t(1) << d;
  ++fake_cuda::set_device_calls;
  return cudaSuccess;
}
inline cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int, unsigned long long,
                                                    cudaDriverEntryPointQueryResult* found) {
  const bool known = std::strcmp(symbol, "cuDevicePrimaryCtxGetState") == 0;
  *fn = known ? reinterpret_cast<void*>(&fake_cuda::primary_ctx_get_state) : nullptr;
  if (found) *found = known ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  *e = reinterpret_cast<cudaEvent_t>(new int(0));
  ++fake_cuda::event_calls;
  ++fake_cuda::events_created;
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = reinterpret_cast<cudaStream_t>(new int(0));
  ++fake_cuda::streams_created;
  return cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<int*>(e);
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) {
  ++fake_cuda::event_calls;
  ++fake_cuda::stream_ops.event_ops;
  return cudaSuccess;
}
inline cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) {
  ++fake_cuda::event_calls;
  ++fake_cuda::stream_ops.event_ops;
  return cudaSuccess;
}
namespace fake_cuda {
// One aligned 8-byte word is copied whole, as the GPU's copy engines write it
// (no torn word), and unordered with anything else: a relaxed atomic store,
// so ThreadSanitizer accepts a kernel polling that word
// (ipc_steps::fail_enqueue sets a rank's abort word so) and still reports any
// data read on the strength of it.
inline bool copies_one_word(const void* d, const void* s, size_t b) {
  return b == 8 && (reinterpret_cast<uintptr_t>(d) & 7u) == 0 && (reinterpret_cast<uintptr_t>(s) & 7u) == 0;
}
}  // namespace fake_cuda

inline cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t b, cudaMemcpyKind, cudaStream_t) {
  if (fake_cuda::copies_one_word(d, s, b))
    __atomic_store_n(static_cast<uint64_t*>(d), __atomic_load_n(static_cast<const uint64_t*>(s), __ATOMIC_RELAXED),
                     __ATOMIC_RELAXED);
  else
    std::memmove(d, s, b);
  ++fake_cuda::copies;
  ++fake_cuda::stream_ops.memcpys;
  fake_cuda::stream_ops.bytes += 2 * int64_t(b);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyPeerAsync(void* d, int, const void* s, int, size_t b, cudaStream_t) {
  std::memmove(d, s, b);
  ++fake_cuda::copies;
  ++fake_cuda::stream_ops.memcpys;
  fake_cuda::stream_ops.bytes += 2 * int64_t(b);
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr, int) {
  *v = 2;
  return cudaSuccess;
}
inline cudaError_t cudaGetLastError() {
  const cudaError_t e = fake_cuda::last_error;
  fake_cuda::last_error = cudaSuccess;
  return e;
}
inline const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    default: return "unknown error";
  }
}
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
