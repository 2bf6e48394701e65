// Peer access between the GPUs of one process: whether kernels running on one
// device may load from and store to another device's memory (NVLink or PCIe
// P2P), enabled once per ordered pair and remembered.
#pragma once

#include <cuda_runtime_api.h>

namespace fastpar {
namespace cuda_p2p {

// Sets *ok to whether kernels on `device` can access memory on `peer`,
// enabling that access the first time the pair is asked about. A device always
// reaches itself. Peer access is one-directional: (a, b) and (b, a) are
// separate pairs. Returns the CUDA error of the probe or of enabling, if any.
cudaError_t ensure_peer_access(int device, int peer, bool* ok);

}  // namespace cuda_p2p
}  // namespace fastpar
