// The per-GPU tuning entries (cuda_tuning.h): parsed once, when a group's
// CUDA engine is given the table; picked at IPC setup.
#include "cuda_tuning.h"

#include <c10/util/Exception.h>

#include "knobs.h"  // ChoiceNames

namespace fastpar {
namespace distributed {
namespace {

bool one_of(const std::string& model, const std::string& key, const std::string& value, ChoiceNames names) {
  TORCH_CHECK_VALUE(value == names.on || value == names.off, "fastpar: the CUDA tuning entry for '", model, "' has ",
                    key, " = '", value, "' but it must be '", names.on, "' or '", names.off, "'");
  return value == names.on;
}

int64_t count(const std::string& model, const std::string& key, const std::string& value, int64_t min, int64_t max) {
  const bool digits = !value.empty() && value.size() <= 18 &&
                      value.find_first_not_of("0123456789") == std::string::npos;
  const int64_t v = digits ? std::stoll(value) : -1;
  TORCH_CHECK_VALUE(digits && v >= min && v <= max, "fastpar: the CUDA tuning entry for '", model, "' has ", key,
                    " = '", value, "' but it must be a whole number from ", min, " to ", max);
  return v;
}

}  // namespace

GpuTuning parse_tuning(const std::string& model, const std::map<std::string, std::string>& fields) {
  GpuTuning t;
  static const std::string kOneShot = "one_shot_max_bytes/";
  for (const auto& [key, value] : fields) {
    if (key == "source") {
      t.source = value;
    } else if (key == "two_shot") {
      t.fused_two_shot = one_of(model, key, value, kFusedForm);
    } else if (key == "collectives") {
      t.fused_collectives = one_of(model, key, value, kFusedForm);
    } else if (key == "fence_scope") {
      t.gpu_fence_scope = one_of(model, key, value, kFenceScope);
    } else if (key == "barrier") {
      t.per_peer_waits = one_of(model, key, value, kBarrierForm);
    } else if (key.compare(0, kOneShot.size(), kOneShot) == 0) {
      const int ranks = int(count(model, key, key.substr(kOneShot.size()), 2, 64));
      t.one_shot_max_bytes[ranks] = count(model, key, value, 0, int64_t(1) << 40);
    } else {
      TORCH_CHECK_VALUE(false, "fastpar: the CUDA tuning entry for '", model, "' has the key '", key,
                        "' but the keys are source, two_shot, collectives, fence_scope, barrier and "
                        "one_shot_max_bytes/<ranks>");
    }
  }
  return t;
}

const GpuTuning* tuning_for(const TuningTable& table, const std::vector<std::string>& models) {
  if (models.empty() || models.front().empty()) return nullptr;
  for (const std::string& m : models)
    if (m != models.front()) return nullptr;
  const auto it = table.find(models.front());
  return it == table.end() ? nullptr : &it->second;
}

}  // namespace distributed
}  // namespace fastpar
