#include "peer_access.h"

#include <map>
#include <mutex>
#include <utility>

#include "cuda_try.h"

namespace fastpar {
namespace cuda_p2p {
namespace {

// Enabling is process-wide and permanent, so the answer for a pair never
// changes: cache it and skip the driver calls on every collective.
std::mutex& cache_mutex() {
  static std::mutex m;
  return m;
}

std::map<std::pair<int, int>, bool>& cache() {
  static std::map<std::pair<int, int>, bool> c;
  return c;
}

cudaError_t probe_and_enable(int device, int peer, bool* ok) {
  int can = 0;
  FASTPAR_CUDA_TRY(cudaDeviceCanAccessPeer(&can, device, peer));
  if (!can) {
    *ok = false;
    return cudaSuccess;
  }
  DeviceRestore restore;
  FASTPAR_CUDA_TRY(cudaSetDevice(device));
  const cudaError_t err = cudaDeviceEnablePeerAccess(peer, 0);
  if (err == cudaErrorPeerAccessAlreadyEnabled) {
    // Someone else (torch's own copy kernels, another library) enabled it:
    // that is the state we want. The call also set the thread's last error,
    // which a later cudaGetLastError after a kernel launch would misreport.
    cudaGetLastError();
  } else if (err == cudaErrorTooManyPeers || err == cudaErrorPeerAccessUnsupported) {
    // The driver said the pair can, yet refuses: past its peer limit, or a
    // link it cannot map. Not a failure of the call: the ops stage instead.
    cudaGetLastError();
    *ok = false;
    return cudaSuccess;
  } else if (err != cudaSuccess) {
    return err;
  }
  *ok = true;
  return cudaSuccess;
}

}  // namespace

cudaError_t ensure_peer_access(int device, int peer, bool* ok) {
  if (device == peer) {
    *ok = true;
    return cudaSuccess;
  }
  std::lock_guard<std::mutex> lock(cache_mutex());
  const auto key = std::make_pair(device, peer);
  const auto it = cache().find(key);
  if (it != cache().end()) {
    *ok = it->second;
    return cudaSuccess;
  }
  FASTPAR_CUDA_TRY(probe_and_enable(device, peer, ok));
  cache()[key] = *ok;
  return cudaSuccess;
}

}  // namespace cuda_p2p
}  // namespace fastpar
