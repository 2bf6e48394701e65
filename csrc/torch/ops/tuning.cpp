#include "tuning.h"

#include <c10/util/Exception.h>

namespace fastpar {
namespace ops {

Tuning& tuning() {
  static Tuning t;
  return t;
}

ListOpPaths& list_op_paths() {
  static ListOpPaths p;
  return p;
}

const char* device_model_name(DeviceModel m) {
  switch (m) {
    case DeviceModel::kReal: return "real";
    case DeviceModel::kDistinctPeer: return "distinct_peer";
    case DeviceModel::kDistinctStaging: return "distinct_staging";
  }
  return "real";
}

DeviceModel device_model_from(const std::string& name) {
  DeviceModel found = DeviceModel::kReal;
  bool known = false;
  for (DeviceModel m : {DeviceModel::kReal, DeviceModel::kDistinctPeer, DeviceModel::kDistinctStaging}) {
    if (name == device_model_name(m)) {
      found = m;
      known = true;
    }
  }
  TORCH_CHECK_VALUE(known, "model must be one of 'real', 'distinct_peer', 'distinct_staging', got '", name, "'");
  return found;
}

}  // namespace ops
}  // namespace fastpar
