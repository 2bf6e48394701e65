// The FASTPAR_* environment variables the torch.distributed backend reads, in
// one place: parsed when a group is created, refused by name when malformed,
// and handed to the torch-free core as options structs (the core reads no
// environment). docs/knobs.md lists them.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "../../core/executors/cpu_shm/shm_collectives.h"
#include "../../core/transport/cpu_shm/shm_comm.h"

namespace fastpar {
namespace distributed {

struct ShmKnobs {
  cpu_shm::ShmOptions options;  // FASTPAR_SHM_SLOT_BYTES, _REGISTERED_BYTES, _P2P_CHUNK_BYTES
  cpu_shm::ShmTuning tuning;    // FASTPAR_SHM_ONESHOT_MAX_BYTES, _REGISTERED_MIN_BYTES, _ALLREDUCE
};
ShmKnobs shm_knobs(std::chrono::milliseconds timeout);

struct CudaKnobs {
  int64_t ipc_max_bytes;    // FASTPAR_CUDA_IPC_MAX_BYTES: larger calls between distinct GPUs go to NCCL
  int64_t ipc_slot_bytes;   // FASTPAR_CUDA_IPC_SLOT_BYTES
  int64_t registered_bytes; // FASTPAR_CUDA_IPC_REGISTERED_BYTES
  bool blocking_wait;       // FASTPAR_BLOCKING_WAIT
  // The schedule choices, unset where the environment does not name one (then
  // the default decides: steps, CudaEngine):
  // FASTPAR_CUDA_IPC_TWO_SHOT: "fused" (one kernel a call) or "steps";
  // FASTPAR_CUDA_IPC_COLLECTIVES: the same choice for broadcast, gather,
  // scatter, all_to_all, reduce and reduce_scatter.
  std::optional<bool> ipc_fused_two_shot, ipc_fused_collectives;
  // FASTPAR_CUDA_IPC_ONE_SHOT_MAX_BYTES: all_reduce runs one-shot up to this
  // many bytes (and one slot); -1 when unset.
  int64_t ipc_one_shot_max_bytes;
};
CudaKnobs cuda_knobs();
// The two values of a schedule choice as the knobs and the engine's getters
// spell them; `on` is the newer schedule.
struct ChoiceNames {
  const char* on;
  const char* off;
  const char* name(bool v) const { return v ? on : off; }
};
inline constexpr ChoiceNames kFusedForm{"fused", "steps"};
// The one-kernel calls' block barriers (cuda_ipc::FlagForm): flags written
// into the waiter's memory, or the peer's flag polled. The test hook only
// (CudaEngine::testing_override): no environment variable.
inline constexpr ChoiceNames kFlagForm{"waiter", "peer"};
// `value` as one of `names`; otherwise refused: "fastpar: <what> is '<value>'
// but must be '<on>' or '<off>'".
bool parse_choice(const char* what, const std::string& value, ChoiceNames names);

// FASTPAR_CPU_ISA: the vector loops of every CPU reduction (list ops and
// backend alike); applied once, when the extension is imported.
void apply_cpu_isa_knob();

// Byte counts and flags as the knobs take them; `name` is in the errors.
int64_t env_bytes(const char* name, int64_t dflt, int64_t min);
bool env_flag(const char* name);

}  // namespace distributed
}  // namespace fastpar
