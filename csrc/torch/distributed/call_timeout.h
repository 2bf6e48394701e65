// The timeout one collective waits for: torch passes the caller's in every
// call's options (0 when none was given), and then the group's applies.
#pragma once

#include <chrono>
#include <cstdint>

namespace fastpar {
namespace distributed {

inline std::chrono::milliseconds call_timeout(std::chrono::milliseconds given, std::chrono::milliseconds group) {
  return given.count() > 0 ? given : group;
}

// A timeout in nanoseconds for the kernels' flag waits, saturating
// (timedelta.max is ~1e17 ms; times a million it would wrap).
inline uint64_t timeout_ns(std::chrono::milliseconds t) {
  const uint64_t ms = t.count() > 0 ? uint64_t(t.count()) : 0;
  return ms > ~uint64_t(0) / 1000000 ? ~uint64_t(0) : ms * 1000000;
}

}  // namespace distributed
}  // namespace fastpar
