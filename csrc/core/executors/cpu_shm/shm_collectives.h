// The cpu_shm collectives with runtime dtype / op: this is where the schedules
// of algorithms/*_slots.h are instantiated (one translation unit, so the
// dtype x op templates compile once). Torch-free; the c10d backend calls these.
#pragma once

#include <cstdint>

#include "../../kernels/reduce_ops.h"
#include "../../transport/cpu_shm/shm_comm.h"
#include "shm_placement.h"

namespace fastpar {
namespace cpu_shm {

// Which allreduce schedule; kAuto picks by size (see choose_allreduce).
enum class AllreduceAlgo : int { kAuto = 0, kOneShot = 1, kTwoShot = 2 };

struct ShmTuning {
  // Largest message that goes one-shot (also capped by the slot size); -1:
  // the measured default for the communicator's size.
  int64_t one_shot_max_bytes;
  AllreduceAlgo algo;
  // Registered buffers at least this large take the zero-copy schedule
  // (allreduce_registered); smaller ones run the copying schedules in place,
  // which measured faster for them (see shm_collectives.cpp).
  int64_t registered_min_bytes;
  // How the two-shot family crosses between the ranks' caches (shm_placement.h).
  PlacementMode placement = PlacementMode::kAuto;
};

// The measured defaults (shm_collectives.cpp); the torch layer overrides them
// from FASTPAR_SHM_ONESHOT_MAX_BYTES, _REGISTERED_MIN_BYTES and
// FASTPAR_SHM_ALLREDUCE=auto|one_shot|two_shot and FASTPAR_SHM_PLACEMENT=auto|near|far
// (torch/distributed/knobs.h).
ShmTuning default_shm_tuning();

// In place is allowed (in == out). If `in` lies in this rank's registered arena
// and the size calls for two-shot, the registered schedule (no copy-in) is the
// near form and the copying two-shot's far form the far one. Calls of the
// two-shot family run near or far as `placement` chooses (it is the
// communicator's: the same object for every call).
void allreduce(ShmComm& c, const ShmTuning& t, Placement& placement, const void* in, void* out, int64_t count,
               DType dt, ReduceOp op);
// How many allreduce calls of this process took the registered schedule: the
// tests' proof that a registered buffer skipped the copy-in, or not (the
// result alone is the same either way).
int64_t registered_allreduce_calls();
void reduce(ShmComm& c, const void* in, void* out, int64_t count, DType dt, ReduceOp op, int root);
void reduce_scatter(ShmComm& c, const void* in, void* out, int64_t count, DType dt, ReduceOp op);
void broadcast(ShmComm& c, void* data, int64_t count, DType dt, int root);
// outs[q] receives rank q's data; root < 0: on every rank (allgather).
void gather(ShmComm& c, const void* in, void* const* outs, int64_t count, DType dt, int root);
void scatter(ShmComm& c, const void* const* ins, void* out, int64_t count, DType dt, int root);
// Offsets and sizes in elements of dt, one entry per rank.
void alltoall(ShmComm& c, const void* in, const int64_t* in_off, const int64_t* in_count, void* out,
              const int64_t* out_off, const int64_t* out_count, DType dt);
void barrier(ShmComm& c);
// Collective: agree on an arena offset for a new registered buffer of `bytes`;
// returns it, or throws if the arena is full or ranks disagree.
int64_t register_alloc(ShmComm& c, int64_t bytes);

}  // namespace cpu_shm
}  // namespace fastpar
