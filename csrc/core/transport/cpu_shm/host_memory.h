// The host memory-ordering policy for flags::*: what the CPU shared-memory
// transport plugs into core/transport/flag_protocol.h (the CUDA IPC transport
// supplies ld.acquire.sys / st.release.sys instead).
//
// x86-64 is TSO, so acquire/release compile to plain loads and stores plus a
// compiler barrier; on ARM they become ldar/stlr. Either way no syscall and no
// full fence is on the fast path. The flags live in MAP_SHARED memory that is
// coherent across processes exactly as across threads.
#pragma once

#include <cstdint>
#include <ctime>

namespace fastpar {
namespace cpu_shm {

struct HostMemory {
  static uint64_t load_acquire(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
  static void store_release(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
  static void pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
  }
  // CLOCK_MONOTONIC is served by the vDSO: no syscall.
  static uint64_t now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
  }
};

}  // namespace cpu_shm
}  // namespace fastpar
