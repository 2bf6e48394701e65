// The one piece of the IPC schedules that is device code: launching the phase
// step (phase_step.h, run by ipc_phase_kernel.cuh). Split out so that the schedules (ipc_allreduce.cpp)
// are plain host code.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "../../transport/flag_protocol.h"
#include "../../transport/cuda_ipc/ipc_comm.h"  // MismatchRecord

namespace fastpar {
namespace cuda_ipc {

struct PhaseArgs {
  flags::ControlBlock* self;
  // Read, but for the one-kernel calls' kWaiterMemory form, which writes its
  // arrivals into the peers' inboxes (inbox_of).
  flags::ControlBlock* peers[kMaxIpcRanks];        // peers[rank] is unused
  uint32_t* status;                                 // this rank's status word
  uint32_t* host_status;                            // its host-mapped mirror, or null
  const uint64_t* host_abort;                       // host abort word, device view (phase_step.h), or null
  MismatchRecord* host_mismatch;                    // device view, or null
  flags::OpDesc desc;
  int rank;
  int size;
  uint64_t timeout_ns;
  FlagForm flag_form;  // the one-kernel calls' block barriers (ipc_arena.h); the phase kernel ignores it
};

// Enqueues on `stream` (a stream of the current device): if *status != 0,
// abort this rank; else post desc.seq and wait until every peer has posted it
// with the same descriptor, recording a failure in *status (a timeout, a
// peer's abort, a mismatch, or the code the host wrote to *host_abort).
cudaError_t launch_phase(const PhaseArgs& a, cudaStream_t stream);

// Loads the phase kernel now rather than at its first launch (see
// cuda_kernels::preload_reduce_kernels).
cudaError_t preload_phase_kernel();

}  // namespace cuda_ipc
}  // namespace fastpar
