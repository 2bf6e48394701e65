// The timeout one collective waits for: torch passes the caller's in every
// call's options (0 when none was given), and then the group's applies.
#pragma once

#include <chrono>

namespace fastpar {
namespace ops {

inline std::chrono::milliseconds call_timeout(std::chrono::milliseconds given, std::chrono::milliseconds group) {
  return given.count() > 0 ? given : group;
}

}  // namespace ops
}  // namespace fastpar
