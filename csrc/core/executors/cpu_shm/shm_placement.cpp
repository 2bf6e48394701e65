#include "shm_placement.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "../../algorithms/copy_collectives_slots.h"
#include "../../transport/cpu_shm/host_memory.h"

namespace fastpar {
namespace cpu_shm {

PlacementMode parse_placement_mode(const std::string& s, const char* what) {
  if (s.empty() || s == "auto") return PlacementMode::kAuto;
  if (s == "near") return PlacementMode::kNear;
  if (s == "far") return PlacementMode::kFar;
  throw std::invalid_argument(std::string("fastpar: ") + what + " is '" + s + "' but must be 'auto', 'near' or 'far'");
}

const char* placement_mode_name(PlacementMode m) {
  switch (m) {
    case PlacementMode::kNear: return "near";
    case PlacementMode::kFar: return "far";
    case PlacementMode::kAuto: break;
  }
  return "auto";
}

namespace {

// The probe's phases carry the allreduce's descriptor with this aux, so a rank
// that probes while a peer runs the schedule fails as a mismatch, not a hang.
constexpr int64_t kAuxProbe = kAuxOneShot + 16;
constexpr int kProbeRounds = 4;  // per way, alternating; the best counts (the first touches pages)

// Every rank's `mine`, in rank order, on every rank (one allgather through the slots).
template <class T>
std::vector<T> allgather_value(ShmComm& c, const T& mine) {
  const int n = c.size();
  std::vector<T> all(static_cast<size_t>(n));
  std::vector<char*> outs(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) outs[q] = reinterpret_cast<char*>(&all[q]);
  gather_slots(c, CollCall{Coll::kAllreduce, -1, DType::U8, -1, -1, kAuxProbe}, reinterpret_cast<const char*>(&mine),
               outs.data(), int64_t(sizeof(T)), -1);
  return all;
}

}  // namespace

bool Placement::choose(ShmComm& c) {
  ++large_calls_;
  if (mode_ != PlacementMode::kAuto) return mode_ == PlacementMode::kFar;
  if (c.size() < 2) return false;
  if (!measured_ || (large_calls_ % kCheckEvery == 0 && agree_drift(c))) probe(c);
  return far_;
}

// Each rank publishes kProbeBytes into its slot, one phase, and reads its
// successor's slot, timing the whole crossing; the ways alternate round by
// round so that both see the same moment of the machine. Then every rank's
// best times go to every rank and each takes the same decision from the
// slowest rank's: far only when the near way is clearly slower.
void Placement::probe(ShmComm& c) {
  const int n = c.size(), r = c.rank(), next = (r + 1) % n;
  const int64_t bytes = std::max<int64_t>(64, std::min(kProbeBytes, c.slot_bytes()) / 64 * 64);
  std::vector<char> src(static_cast<size_t>(bytes), char(r + 1)), dst(static_cast<size_t>(bytes), 0);
  const CollCall call{Coll::kAllreduce, -1, DType::U8, -1, -1, kAuxProbe};
  double best[2] = {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
  for (int round = 0; round < kProbeRounds; ++round)
    for (int way = 0; way < 2; ++way) {
      const int k = c.next_round();
      const uint64_t t0 = HostMemory::now_ns();
      if (way == 1) stream_copy(c.slot(r, k), src.data(), bytes);
      else std::memcpy(c.slot(r, k), src.data(), size_t(bytes));
      c.phase(call);
      std::memcpy(dst.data(), c.slot(next, k), size_t(bytes));
      best[way] = std::min(best[way], double(HostMemory::now_ns() - t0) * 1e-3);
    }
  struct Times {
    double near_us, far_us;
  };
  const std::vector<Times> all = allgather_value(c, Times{best[0], best[1]});
  PlacementProbe p;
  for (const Times& t : all) {
    p.near_us = std::max(p.near_us, t.near_us);
    p.far_us = std::max(p.far_us, t.far_us);
  }
  last_ = p;
  far_ = p.near_us > kFarMargin * p.far_us;
  measured_ = true;
  ++probes_;
  reset_watch();
}

bool Placement::agree_drift(ShmComm& c) {
  ++checks_;
  const int64_t mine = drifted_ ? 1 : 0;
  for (int64_t d : allgather_value(c, mine))
    if (d != 0) return true;
  return false;
}

void Placement::record(int64_t bytes, uint64_t ns) {
  if (mode_ != PlacementMode::kAuto || !measured_ || bytes <= 0) return;
  const int cls = std::min(kClasses - 1, 63 - __builtin_clzll(uint64_t(bytes)));
  Watch& w = watch_[cls];
  const double rate = double(ns) / double(bytes);
  if (w.n < kRefCalls) {
    w.first[w.n++] = rate;
    if (w.n == kRefCalls) {
      double sorted[kRefCalls];
      std::copy(w.first, w.first + kRefCalls, sorted);
      std::sort(sorted, sorted + kRefCalls);
      w.ref = w.mean = sorted[kRefCalls / 2];
    }
    return;
  }
  w.mean += (rate - w.mean) / 8;  // about the last 8 calls of the class
  if (w.mean > kDrift * w.ref || w.mean * kDrift < w.ref) drifted_ = true;
}

void Placement::mark_drifted() { drifted_ = true; }

void Placement::reset_watch() {
  for (Watch& w : watch_) w = Watch{};
  drifted_ = false;
}

void Placement::set_mode(PlacementMode m) {
  mode_ = m;
  measured_ = false;
  far_ = false;
  reset_watch();
}

PlacementReport Placement::report() const {
  PlacementReport r;
  r.mode = mode_;
  r.measured = measured_;
  r.far = mode_ == PlacementMode::kAuto ? far_ : mode_ == PlacementMode::kFar;
  r.last = last_;
  r.probes = probes_;
  r.checks = checks_;
  r.large_calls = large_calls_;
  return r;
}

}  // namespace cpu_shm
}  // namespace fastpar
