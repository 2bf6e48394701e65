#include "ipc_endpoint.h"

#include <cstring>

#include "../flag_protocol.h"
#include "../cuda_p2p/cuda_try.h"
#include "ipc_handles.h"

namespace fastpar {
namespace cuda_ipc {
namespace {
// The pinned, host-mapped words: the status mirror at 0, the host abort
// word at 8, the replays' failure word at 16, the mismatch record at 64 (its
// own cache line).
constexpr size_t kHostAbortOffset = 8;
constexpr size_t kHostReplayFailureOffset = 16;
constexpr size_t kHostMismatchOffset = 64;
constexpr size_t kHostWordsBytes = kHostMismatchOffset + sizeof(MismatchRecord);
}  // namespace

IpcEndpoint::~IpcEndpoint() {
  disconnect();
  // No barrier here (a CudaIpcComm dropped without close(), say by a rank
  // that raised in its loop, or a setup unwinding an exception): peers may
  // still map the arena, with kernels queued that poll its flags or read its
  // slots. Freed pages that a later cudaMalloc reuses could show them a
  // flag >= their phase over garbage, reduced silently; so the arena is left
  // to the driver (freed at exit). Only one whose handle never left the
  // process is freed: no peer can have it.
  if (exported_) {
    abandon_arena();
  } else {
    free_arena();
  }
  // The host words go last: abort() and Works on other threads may read or
  // raise them until the endpoint itself goes, and they keep it alive (the
  // backend's IpcLink holds it by shared_ptr). Freed only once the device was
  // idle after our last kernel; a broken device keeps them (as the arena).
  if (host_status_ != nullptr && device_idle_) cudaFreeHost(host_status_);
}

cudaError_t IpcEndpoint::create(int rank, int size, int device, size_t slot_bytes, size_t registered_bytes) {
  // Once per endpoint: the host words outlive free_arena() (see the header).
  if (host_status_ != nullptr || size < 1 || size > kMaxIpcRanks || rank < 0 || rank >= size || device < 0 ||
      slot_bytes < 64)
    return cudaErrorInvalidValue;
  cuda_p2p::DeviceRestore restore;
  FASTPAR_CUDA_TRY(cudaSetDevice(device));
  // The mirror first: a failure after the arena exists would have to free it.
  void* host = nullptr;
  FASTPAR_CUDA_TRY(cudaHostAlloc(&host, kHostWordsBytes, cudaHostAllocMapped));
  std::memset(host, 0, kHostWordsBytes);
  __atomic_store_n(reinterpret_cast<uint64_t*>(static_cast<char*>(host) + kHostAbortOffset), uint64_t(0),
                   __ATOMIC_RELEASE);
  void* dev_view = nullptr;
  void* base = nullptr;
  cudaError_t err = cudaHostGetDevicePointer(&dev_view, host, 0);
  if (err == cudaSuccess) err = arena_alloc(slot_bytes, registered_bytes, &base);
  if (err != cudaSuccess) {
    cudaFreeHost(host);
    return err;
  }
  host_status_ = static_cast<uint32_t*>(host);
  host_abort_ = reinterpret_cast<uint64_t*>(static_cast<char*>(host) + kHostAbortOffset);
  host_mismatch_ = reinterpret_cast<MismatchRecord*>(static_cast<char*>(host) + kHostMismatchOffset);
  host_replay_failure_ = reinterpret_cast<uint32_t*>(static_cast<char*>(host) + kHostReplayFailureOffset);
  c_ = IpcComm{};
  c_.rank = rank;
  c_.size = size;
  c_.device = device;
  c_.slot_bytes = slot_bytes;
  c_.registered_bytes = registered_bytes;
  c_.bases[rank] = base;
  c_.host_status = static_cast<uint32_t*>(dev_view);
  c_.host_abort = reinterpret_cast<const uint64_t*>(static_cast<char*>(dev_view) + kHostAbortOffset);
  c_.host_abort_host = host_abort_;
  c_.host_mismatch = reinterpret_cast<MismatchRecord*>(static_cast<char*>(dev_view) + kHostMismatchOffset);
  c_.host_replay_failure = reinterpret_cast<uint32_t*>(static_cast<char*>(dev_view) + kHostReplayFailureOffset);
  return cudaSuccess;
}

cudaError_t IpcEndpoint::export_handle(cudaIpcMemHandle_t* handle) {
  if (!created()) return cudaErrorInvalidValue;
  cuda_p2p::DeviceRestore restore;
  FASTPAR_CUDA_TRY(cudaSetDevice(c_.device));
  FASTPAR_CUDA_TRY(cuda_ipc::export_handle(c_.bases[c_.rank], handle));
  exported_ = true;
  return cudaSuccess;
}

cudaError_t IpcEndpoint::connect(const cudaIpcMemHandle_t* handles) {
  if (!created() || connected_) return cudaErrorInvalidValue;
  cuda_p2p::DeviceRestore restore;
  FASTPAR_CUDA_TRY(cudaSetDevice(c_.device));
  for (int q = 0; q < c_.size; ++q) {
    if (q == c_.rank) continue;
    const cudaError_t err = open_handle(handles[q], &c_.bases[q]);
    if (err != cudaSuccess) {
      c_.bases[q] = nullptr;
      for (int p = 0; p < q; ++p) {
        if (p == c_.rank || !c_.bases[p]) continue;
        close_handle(c_.bases[p]);
        c_.bases[p] = nullptr;
      }
      return err;
    }
  }
  connected_ = true;
  return cudaSuccess;
}

cudaError_t IpcEndpoint::disconnect() {
  if (!connected_) return cudaSuccess;
  cuda_p2p::DeviceRestore restore;
  FASTPAR_CUDA_TRY(cudaSetDevice(c_.device));
  // Work enqueued on any stream of this device may still read the mappings.
  FASTPAR_CUDA_TRY(cudaDeviceSynchronize());
  connected_ = false;
  cudaError_t first = cudaSuccess;
  for (int q = 0; q < c_.size; ++q) {
    if (q == c_.rank || !c_.bases[q]) continue;
    const cudaError_t err = close_handle(c_.bases[q]);
    if (first == cudaSuccess) first = err;
    c_.bases[q] = nullptr;
  }
  return first;
}

cudaError_t IpcEndpoint::free_arena() {
  if (!created()) return cudaSuccess;
  cuda_p2p::DeviceRestore restore;
  FASTPAR_CUDA_TRY(cudaSetDevice(c_.device));
  // Our own kernels write the arena and the mirror.
  FASTPAR_CUDA_TRY(cudaDeviceSynchronize());
  void* own = c_.bases[c_.rank];
  c_.bases[c_.rank] = nullptr;
  device_idle_ = true;
  return arena_free(own);
}

void IpcEndpoint::abandon_arena() {
  if (!created()) return;
  cuda_p2p::DeviceRestore restore;
  // Our kernels read the host words: they may be freed (by the destructor)
  // only after the device has been idle; a broken device keeps them.
  device_idle_ = cudaSetDevice(c_.device) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess;
  c_.bases[c_.rank] = nullptr;
}

void IpcEndpoint::raise_host_abort(uint32_t code) {
  if (host_abort_ == nullptr || code == 0) return;
  raise_abort_word(host_abort_, code);
}

uint64_t IpcEndpoint::host_abort() const { return host_abort_ ? __atomic_load_n(host_abort_, __ATOMIC_ACQUIRE) : 0u; }

uint32_t IpcEndpoint::host_status() const {
  return host_status_ ? __atomic_load_n(host_status_, __ATOMIC_ACQUIRE) : 0u;
}

uint32_t IpcEndpoint::replay_failure() const {
  return host_replay_failure_ ? __atomic_load_n(host_replay_failure_, __ATOMIC_ACQUIRE) : 0u;
}

bool IpcEndpoint::mismatch(int* peer, flags::OpDesc* mine, flags::OpDesc* theirs) const {
  if (host_mismatch_ == nullptr) return false;
  // Acquire: pairs with the kernel's st.release.sys after the descriptors.
  const uint64_t p = __atomic_load_n(&host_mismatch_->peer_plus_one, __ATOMIC_ACQUIRE);
  if (p == 0) return false;
  *peer = int(p - 1);
  *mine = host_mismatch_->mine;
  *theirs = host_mismatch_->theirs;
  return true;
}

}  // namespace cuda_ipc
}  // namespace fastpar
