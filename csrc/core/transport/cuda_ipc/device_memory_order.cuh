// The memory-ordering policy of core/transport/flag_protocol.h for GPU code: the
// device side of the one protocol the CPU shared-memory transport also runs.
//
// Scope: .sys for every flag. The flag and the data it publishes are read by
// kernels of other processes, on other GPUs (over NVLink / PCIe through IPC
// mappings) or on this one; PTX defines .gpu scope over the threads of one
// program only, so .sys is the scope between processes (as NCCL and vLLM).
// The host abort word (pinned host memory the host writes) is read at .sys
// scope too. st.release / ld.acquire need sm_70+; we build for sm_80 and sm_90.
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
  // The kWaiterMemory form of the block barriers (ipc_arena.h, FlagForm;
  // phase_step.h): the waiter polls a word of its own memory, which the
  // arriving rank release-stores there, with relaxed loads (no ordering, so
  // no L1 invalidation per poll) and takes one load_acquire of the word once
  // it has seen the phase.
  __device__ static uint64_t load_relaxed(const uint64_t* p) {
    uint64_t v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
  }
  // The host abort word (phase_step.h): written by the host.
  __device__ static uint64_t load_acquire_host(const uint64_t* p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
  }
  // A word the host reads (the mismatch record's last word, phase_step.h):
  // released, so the host that acquires it also reads the record written before it.
  __device__ static void store_release_host(uint64_t* p, uint64_t v) {
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

  // The status word (phase_step.h, record_failure). Only this rank's kernels,
  // all on its own GPU, read or write it (peers read the abort word), so a
  // device-scope compare-and-swap is enough to let the first failure win over
  // blocks and streams; a plain read, since its value alone decides.
  __device__ static uint32_t load_u32(const uint32_t* p) { return *static_cast<const volatile uint32_t*>(p); }
  __device__ static uint32_t cas_u32(uint32_t* p, uint32_t expected, uint32_t desired) {
    return atomicCAS(p, expected, desired);
  }
  // The graphed calls' count of finished blocks (ipc_graph.h, graph_finish):
  // this rank's kernels only, so device scope; acquire-release, so the last
  // block's write of the epoch comes after every block's reads of it.
  __device__ static uint64_t fetch_add(uint64_t* p, uint64_t v) {
    uint64_t old;
    asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
    return old;
  }
  // The status word's host-mapped mirror: released after the mismatch record,
  // so a host that reads kMismatch there also reads the record.
  __device__ static void store_release_u32(uint32_t* p, uint32_t v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
  }
};

}  // namespace cuda_ipc
}  // namespace fastpar
