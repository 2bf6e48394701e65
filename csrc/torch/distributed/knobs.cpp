#include "knobs.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <string>

#include "../../core/kernels/cpu_isa.h"
#include "../../core/transport/cuda_ipc/ipc_arena.h"  // kDefaultSlotBytes
#include "route.h"                                      // kDefaultMaxIpcBytes, parse_byte_count

namespace fastpar {
namespace distributed {

int64_t env_bytes(const char* name, int64_t dflt, int64_t min) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return dflt;
  int64_t out = 0;
  TORCH_CHECK_VALUE(cuda_ipc::parse_byte_count(v, &out) && out >= min, "fastpar: ", name, " is '", v,
                    "' but must be a byte count (decimal digits) >= ", min);
  return out;
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0' || std::string(v) == "0") return false;
  TORCH_CHECK_VALUE(std::string(v) == "1", "fastpar: ", name, " is '", v, "' but must be 0 or 1");
  return true;
}

static int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

ShmKnobs shm_knobs(std::chrono::milliseconds timeout) {
  ShmKnobs k{cpu_shm::default_shm_options(timeout), cpu_shm::default_shm_tuning()};
  cpu_shm::ShmOptions& o = k.options;
  o.slot_bytes = round_up(env_bytes("FASTPAR_SHM_SLOT_BYTES", o.slot_bytes, 1024), 64);
  o.arena_bytes = round_up(env_bytes("FASTPAR_SHM_REGISTERED_BYTES", o.arena_bytes, 0), 4096);
  o.p2p_chunk_bytes = round_up(env_bytes("FASTPAR_SHM_P2P_CHUNK_BYTES", o.p2p_chunk_bytes, 64), 64);
  cpu_shm::ShmTuning& t = k.tuning;
  t.one_shot_max_bytes = env_bytes("FASTPAR_SHM_ONESHOT_MAX_BYTES", t.one_shot_max_bytes, -1);
  t.registered_min_bytes = env_bytes("FASTPAR_SHM_REGISTERED_MIN_BYTES", t.registered_min_bytes, 0);
  const char* a = std::getenv("FASTPAR_SHM_ALLREDUCE");
  const std::string s = a ? a : "";
  if (s == "one_shot") t.algo = cpu_shm::AllreduceAlgo::kOneShot;
  else if (s == "two_shot") t.algo = cpu_shm::AllreduceAlgo::kTwoShot;
  else
    TORCH_CHECK_VALUE(s.empty() || s == "auto", "fastpar: FASTPAR_SHM_ALLREDUCE is '", s,
                      "' but must be 'auto', 'one_shot' or 'two_shot'");
  const char* pl = std::getenv("FASTPAR_SHM_PLACEMENT");
  try {
    t.placement = cpu_shm::parse_placement_mode(pl ? pl : "", "FASTPAR_SHM_PLACEMENT");
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
  return k;
}

void apply_cpu_isa_knob() {
  const char* v = std::getenv("FASTPAR_CPU_ISA");
  try {
    use_cpu_isa(v ? v : "", "FASTPAR_CPU_ISA");
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
}

bool parse_choice(const char* what, const std::string& value, ChoiceNames names) {
  TORCH_CHECK_VALUE(value == names.on || value == names.off, "fastpar: ", what, " is '", value, "' but must be '",
                    names.on, "' or '", names.off, "'");
  return value == names.on;
}

// A schedule choice's knob: nothing when unset.
static std::optional<bool> env_choice(const char* name, ChoiceNames names) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return parse_choice(name, v, names);
}

CudaKnobs cuda_knobs() {
  return CudaKnobs{env_bytes("FASTPAR_CUDA_IPC_MAX_BYTES", cuda_ipc::kDefaultMaxIpcBytes, 0),
                   env_bytes("FASTPAR_CUDA_IPC_SLOT_BYTES", cuda_ipc::kDefaultSlotBytes, 4096),
                   env_bytes("FASTPAR_CUDA_IPC_REGISTERED_BYTES", 0, 0), env_flag("FASTPAR_BLOCKING_WAIT"),
                   env_choice("FASTPAR_CUDA_IPC_TWO_SHOT", kFusedForm),
                   env_choice("FASTPAR_CUDA_IPC_COLLECTIVES", kFusedForm),
                   env_bytes("FASTPAR_CUDA_IPC_ONE_SHOT_MAX_BYTES", -1, 0)};
}

}  // namespace distributed
}  // namespace fastpar
