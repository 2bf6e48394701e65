// The protocol's phase step (flags::post, then flags::wait_and_check on every
// peer) as a one-thread kernel. Why a kernel of its own rather than a barrier
// inside the reduce kernel: the protocol has one flag per rank, posted once
// every write of the rank is done; between kernels, stream order gives that
// for free, where inside one kernel it would need a grid-wide barrier (and
// co-resident blocks). The cost is one extra launch per phase.
#pragma once

#include <cstdint>

#include "../../algorithms/flag_protocol.h"
#include "device_memory_order.cuh"
#include "ipc_arena.h"
#include "phase_launch.h"

namespace fastpar {
namespace cuda_ipc {

// Peer liveness is the host's business (it sees processes); on the device the
// deadline and the peers' abort words are the ways out of a wait.
struct NoPoll {
  __device__ flags::WaitStatus operator()() const { return flags::WaitStatus::kOk; }
};

__global__ void phase_kernel(PhaseArgs a) {
  if (*a.status != 0) {
    // An earlier phase failed here: tell the peers instead of posting a phase
    // whose data this rank never wrote.
    flags::abort_rank<DeviceMemory>(a.self, *a.status);
    return;
  }
  flags::post<DeviceMemory>(a.self, a.desc);
  const uint64_t deadline = DeviceMemory::now_ns() + a.timeout_ns;
  for (int q = 0; q < a.size; ++q) {
    if (q == a.rank) continue;
    flags::OpDesc theirs;
    const flags::WaitStatus s =
        flags::wait_and_check<DeviceMemory>(a.peers[q], a.desc, deadline, NoPoll{}, &theirs);
    if (s != flags::WaitStatus::kOk) {
      *a.status = uint32_t(s);
      // The host polls this word without synchronizing (the c10d backend's
      // Work::wait); the system-scope release in abort_rank orders it.
      if (a.host_status) *static_cast<volatile uint32_t*>(a.host_status) = uint32_t(s);
      flags::abort_rank<DeviceMemory>(a.self, uint64_t(s));
      return;
    }
  }
}

}  // namespace cuda_ipc
}  // namespace fastpar
