// The memory-ordering policy of algorithms/flag_protocol.h for GPU code: the
// device side of the one protocol the CPU shared-memory transport also runs.
//
// Scope .sys: the flag and the data it publishes are read by kernels on other
// GPUs (over NVLink / PCIe through IPC mappings), so .gpu scope would not
// order them for those readers. st.release / ld.acquire need sm_70+; we build
// for sm_80 and sm_90.
#pragma once

#include <cstdint>

namespace fastpar {
namespace cuda_ipc {

struct DeviceMemory {
  __device__ static uint64_t load_acquire(const uint64_t* p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
  }
  __device__ static void store_release(uint64_t* p, uint64_t v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
  }
  // A short back-off: the spinning thread stops competing for issue slots and
  // for the link it polls over; 100 ns is well under a flag round trip.
  __device__ static void pause() { __nanosleep(100); }
  __device__ static uint64_t now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  }
};

}  // namespace cuda_ipc
}  // namespace fastpar
