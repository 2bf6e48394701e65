#include "shm_placement.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "../../algorithms/copy_collectives_slots.h"

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

// The allgathers of a decision and a drift check carry the allreduce's
// descriptor marked kAuxPlacement: a rank that exchanges while a peer runs
// the schedule fails as a mismatch, not a hang.
const CollCall kExchange{Coll::kAllreduce, -1, DType::U8, -1, -1, kAuxPlacement};

int class_of(int64_t bytes) { return bytes <= 1 ? 0 : 63 - __builtin_clzll(uint64_t(bytes)); }

}  // namespace

bool Placement::choose(ShmComm& c, int64_t bytes) {
  ++large_calls_;
  current_ = -1;
  current_trial_ = false;
  if (mode_ != PlacementMode::kAuto || c.size() < 2) return current_far_ = mode_ == PlacementMode::kFar;
  if (large_calls_ % kCheckEvery == 0 && agree_drift(c)) reset();
  current_ = std::min(kClasses - 1, class_of(bytes));
  bytes_ = bytes;
  Class& k = classes_[current_];
  if (!k.decided && k.trials < kTrials) {
    current_trial_ = true;
    current_far_ = k.trials++ % 2 == 1;
    return current_far_;
  }
  if (!k.decided) decide(c, k);
  return current_far_ = k.far;
}

// Every rank's best trial of each form to every rank; all take the decision
// from the slowest rank's times, so all decide alike.
void Placement::decide(ShmComm& c, Class& k) {
  struct Times {
    double near_us, far_us;
  };
  const std::vector<Times> all = allgather_value(c, kExchange, Times{k.best_us[0], k.best_us[1]});
  k.agreed_us[0] = k.agreed_us[1] = 0;
  for (const Times& t : all) {
    k.agreed_us[0] = std::max(k.agreed_us[0], t.near_us);
    k.agreed_us[1] = std::max(k.agreed_us[1], t.far_us);
  }
  k.far = k.agreed_us[1] > 0 && k.agreed_us[0] > kFarMargin * k.agreed_us[1];
  k.decided = true;
  ++decisions_;
}

bool Placement::agree_drift(ShmComm& c) {
  ++checks_;
  const int64_t mine = drifted_ ? 1 : 0;
  for (int64_t d : allgather_value(c, kExchange, mine))
    if (d != 0) return true;
  return false;
}

void Placement::record(uint64_t ns) {
  if (current_ < 0) return;
  Class& k = classes_[current_];
  if (current_trial_) {
    double& best = k.best_us[current_far_ ? 1 : 0];
    const double us = double(ns) * 1e-3;
    if (best == 0 || us < best) best = us;
    return;
  }
  const double rate = double(ns) / double(std::max<int64_t>(1, bytes_));
  if (k.n < kRefCalls) {
    k.first[k.n++] = rate;
    if (k.n == kRefCalls) {
      double sorted[kRefCalls];
      std::copy(k.first, k.first + kRefCalls, sorted);
      std::sort(sorted, sorted + kRefCalls);
      k.ref = k.mean = sorted[kRefCalls / 2];
    }
    return;
  }
  k.mean += (rate - k.mean) / 8;  // about the class's last 8 calls
  if (k.mean > kDrift * k.ref || k.mean * kDrift < k.ref) drifted_ = true;
}

void Placement::reset() {
  for (Class& k : classes_) k = Class{};
  drifted_ = false;
}

void Placement::set_mode(PlacementMode m) {
  mode_ = m;
  reset();
}

PlacementReport Placement::report() const {
  PlacementReport r;
  r.mode = mode_;
  r.far = mode_ == PlacementMode::kAuto ? current_far_ : mode_ == PlacementMode::kFar;
  for (int i = 0; i < kClasses; ++i) {
    const Class& k = classes_[i];
    if (k.trials == 0) continue;
    PlacementClass pc;
    pc.min_bytes = int64_t(1) << i;
    pc.decided = k.decided;
    pc.far = k.far;
    pc.near_us = k.decided ? k.agreed_us[0] : k.best_us[0];
    pc.far_us = k.decided ? k.agreed_us[1] : k.best_us[1];
    r.classes.push_back(pc);
  }
  r.decisions = decisions_;
  r.checks = checks_;
  r.large_calls = large_calls_;
  return r;
}

}  // namespace cpu_shm
}  // namespace fastpar
