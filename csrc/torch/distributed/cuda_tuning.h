// The schedule choices measured per GPU model: benchmarks/bench_cuda.py's
// summary compares each new schedule with the one it replaces in the same run
// and writes the winners as an entry for the GPU it ran on; the entries ship
// in fastpar/distributed/cuda_tuning.json. Where no knob or setter decides, a
// group whose ranks all run on one model takes that model's entry instead of
// the built-in defaults (docs/knobs.md, "Per-GPU tuning").
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace fastpar {
namespace distributed {

struct GpuTuning {
  std::string source;  // what measured it (date, commit, torch), for CudaEngine.ipc_tuning
  std::optional<bool> fused_two_shot, fused_collectives, gpu_fence_scope, per_peer_waits;
  std::map<int, int64_t> one_shot_max_bytes;  // by the group's rank count
};
// GPU model (cudaDeviceProp::name, torch.cuda.get_device_name) -> its entry.
using TuningTable = std::map<std::string, GpuTuning>;

// An entry from its fields as fastpar/distributed/cuda_tuning.py hands them
// over ("two_shot": "fused", "one_shot_max_bytes/3": "524288", "source": ...).
// An unknown key or a bad value is refused naming the model, the key and the
// value.
GpuTuning parse_tuning(const std::string& model, const std::map<std::string, std::string>& fields);

// The entry for a group whose ranks run on `models` (one per rank, from the
// IPC setup's agreement round, so every rank gets the same answer): null
// where the models differ, one is unknown (empty) or the table has no entry
// for theirs.
const GpuTuning* tuning_for(const TuningTable& table, const std::vector<std::string>& models);

// One schedule choice: a knob's or setter's (set), else the group's tuning
// entry's (tuned, from setup), else the built-in default (off).
struct ScheduleChoice {
  std::optional<bool> set, tuned;
  bool on() const { return set.value_or(tuned.value_or(false)); }
};

}  // namespace distributed
}  // namespace fastpar
