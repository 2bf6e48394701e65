#include "shm_placement.h"

#include <algorithm>
#include <cmath>
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

// The allgathers of a decision and a drift check carry the allreduce's
// descriptor marked kAuxPlacement: a rank that exchanges while a peer runs
// the schedule fails as a mismatch, not a hang.
const CollCall kExchange{Coll::kAllreduce, -1, DType::U8, -1, -1, kAuxPlacement};

int class_of(int64_t bytes) { return bytes <= 1 ? 0 : 63 - __builtin_clzll(uint64_t(bytes)); }

}  // namespace

bool Placement::choose(ShmComm& c, int64_t bytes, PlacedSchedule schedule) {
  ++calls_;
  current_ = -1;
  current_trial_ = false;
  if (mode_ != PlacementMode::kAuto || c.size() < 2) return current_far_ = mode_ == PlacementMode::kFar;
  // Every rank counts the same calls and bytes: all hold the check at the same call.
  ++calls_since_check_;
  bytes_since_check_ += bytes;
  if (calls_since_check_ >= kCheckMaxCalls || (calls_since_check_ >= kCheckEvery && bytes_since_check_ >= kCheckBytes)) {
    calls_since_check_ = bytes_since_check_ = 0;
    agree_drift(c);
  }
  current_ = std::min(kSizes - 1, class_of(bytes)) + int(schedule) * kSizes;
  bytes_ = bytes;
  Class& k = classes_[current_];
  ++k.calls;
  if (k.decided && k.calls >= k.revisit_at) {
    // A decision taken under noise, or a settled one's re-check: measured
    // again (every rank at the same call).
    const int64_t revisit_every = k.revisit_every, recheck_every = k.recheck_every;
    const int form = k.settled ? int(k.far) : -1;
    remeasure(k);
    k.revisit_every = revisit_every;
    k.recheck_every = recheck_every;
    k.rechecked_form = form;
    ++(form >= 0 ? rechecks_ : revisits_);
  }
  if (!k.decided && k.batch == 2 * kBatchPairs) {
    agree(c, k);
    if (k.pairs >= kMinPairs) test(k);
  }
  if (k.decided) return current_far_ = k.far;
  current_trial_ = true;
  return current_far_ = trial_form(k);
}

// Pair p runs near then far when p is even, far then near when odd.
bool Placement::trial_form(const Class& k) const {
  const int pair = k.pairs + k.batch / 2;
  return ((k.batch % 2) == 1) != ((pair % 2) == 1);
}

// Every rank's batch to every rank; each call counts at its fastest rank's
// time, so all ranks hold the same pairs.
void Placement::agree(ShmComm& c, Class& k) {
  struct Batch {
    double us[2 * kBatchPairs];
  };
  Batch mine;
  std::copy(k.mine, k.mine + 2 * kBatchPairs, mine.us);
  const std::vector<Batch> all = allgather_value(c, kExchange, mine);
  for (int i = 0; i < kBatchPairs && k.pairs < kMaxPairs; ++i, ++k.pairs) {
    double t[2];
    for (int j = 0; j < 2; ++j) {
      t[j] = all[0].us[2 * i + j];
      for (const Batch& b : all) t[j] = std::min(t[j], b.us[2 * i + j]);
    }
    const bool far_first = (k.pairs % 2) == 1;
    k.near_us[k.pairs] = far_first ? t[1] : t[0];
    k.far_us[k.pairs] = far_first ? t[0] : t[1];
  }
  k.batch = 0;
}

namespace {

// log(far / near) per pair, sorted.
std::vector<double> log_ratios(const double* near_us, const double* far_us, int pairs) {
  std::vector<double> d(static_cast<size_t>(pairs));
  for (int i = 0; i < pairs; ++i) d[i] = std::log(std::max(far_us[i], 1e-3) / std::max(near_us[i], 1e-3));
  std::sort(d.begin(), d.end());
  return d;
}

double median_sorted(const std::vector<double>& d) {
  const size_t n = d.size();
  return n == 0 ? 0 : (n % 2 ? d[n / 2] : 0.5 * (d[n / 2 - 1] + d[n / 2]));
}

// n <= 64 (the pairs, the reference calls, the watched calls): no allocation
// on the call's path.
double median_of(const double* v, int n) {
  double s[64];
  n = std::min(n, 64);
  std::copy(v, v + n, s);
  std::sort(s, s + n);
  return n == 0 ? 0 : (n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]));
}

// The sign test's two-sided 90% interval of the median of n sorted values:
// [d[r], d[n-1-r]] with the largest r such that P(Binomial(n, 1/2) <= r) <=
// 0.05; -1 when n is too small for one.
int sign_interval_rank(int n) {
  double p = std::pow(0.5, n), cdf = 0;  // P(B = 0)
  int r = -1;
  for (int j = 0; j < n; ++j) {
    cdf += p;
    if (cdf > 0.05) break;
    r = j;
    p = p * double(n - j) / double(j + 1);
  }
  return r;
}

}  // namespace

void Placement::test(Class& k) {
  const std::vector<double> d = log_ratios(k.near_us, k.far_us, k.pairs);
  const int r = sign_interval_rank(k.pairs);
  const double med = median_sorted(d);
  const double eq = std::log(kEquivalent);
  bool settled = false;
  if (r >= 0) {
    const double lo = d[r], hi = d[k.pairs - 1 - r];
    settled = hi < 0 || lo > 0 || (lo > -eq && hi < eq);
  }
  if (!settled && k.pairs < kMaxPairs) return;  // more pairs
  k.decided = true;
  k.far = med < 0;
  k.settled = settled;
  if (!settled) {
    k.revisit_every = k.revisit_every == 0 ? revisit_calls_ : 2 * k.revisit_every;
    k.revisit_at = k.calls + k.revisit_every;
  } else {
    const bool confirmed = k.rechecked_form == int(k.far) && k.recheck_every > 0;
    k.recheck_every = confirmed ? std::min(2 * k.recheck_every, std::max(kRecheckMaxCalls, recheck_calls_))
                                : recheck_calls_;
    k.revisit_at = k.calls + k.recheck_every;
  }
  k.rechecked_form = -1;
  ++decisions_;
}

// Every rank's drifted classes to every rank (a bit per class); each class
// any rank saw drift in is measured again, on every rank alike.
bool Placement::agree_drift(ShmComm& c) {
  ++checks_;
  struct Mask {
    uint64_t bits[(kClasses + 63) / 64];
  };
  Mask mine{};
  for (int i = 0; i < kClasses; ++i)
    if (classes_[i].drifted) mine.bits[i / 64] |= uint64_t(1) << (i % 64);
  Mask any{};
  for (const Mask& m : allgather_value(c, kExchange, mine))
    for (size_t w = 0; w < sizeof(any.bits) / sizeof(any.bits[0]); ++w) any.bits[w] |= m.bits[w];
  bool some = false;
  for (int i = 0; i < kClasses; ++i)
    if (any.bits[i / 64] >> (i % 64) & 1) {
      remeasure(classes_[i]);
      some = true;
    }
  return some;
}

void Placement::remeasure(Class& k) {
  const int64_t calls = k.calls;
  k = Class{};
  k.calls = calls;
}

void Placement::mark_drifted() {
  for (Class& k : classes_)
    if (k.calls > 0) k.drifted = true;
}

void Placement::set_test_hooks(double near_us, double far_us, double noise_us, int64_t revisit_calls,
                               int64_t recheck_calls) {
  test_delay_us_[0] = near_us;
  test_delay_us_[1] = far_us;
  test_noise_us_ = noise_us;
  test_calls_ = 0;
  revisit_calls_ = revisit_calls > 0 ? revisit_calls : kRevisitCalls;
  recheck_calls_ = recheck_calls > 0 ? recheck_calls : kRecheckCalls;
}

void Placement::spin_for_test(uint64_t& ns) {
  double us = test_delay_us_[current_far_ ? 1 : 0];
  if (test_calls_++ % 2 == 1) us += test_noise_us_;
  if (us <= 0) return;
  const uint64_t t0 = HostMemory::now_ns(), until = t0 + uint64_t(us * 1e3);
  uint64_t t = t0;
  while (t < until) t = HostMemory::now_ns();
  ns += t - t0;
}

void Placement::record(uint64_t ns) {
  spin_for_test(ns);
  if (current_ < 0) return;
  Class& k = classes_[current_];
  if (current_trial_) {
    k.mine[k.batch++] = double(ns) * 1e-3;
    return;
  }
  const double rate = double(ns) / double(std::max<int64_t>(1, bytes_));
  if (k.n < kRefCalls) {
    k.first[k.n++] = rate;
    if (k.n == kRefCalls) k.ref = median_of(k.first, kRefCalls);
    return;
  }
  k.recent[k.watched++ % kWatchCalls] = rate;
  if (k.watched % kWatchCalls != 0) return;  // a fresh window every kWatchCalls calls
  const double now = median_of(k.recent, kWatchCalls);
  if (now > kDrift * k.ref || now * kDrift < k.ref) k.drifted = true;
}

void Placement::reset() {
  for (Class& k : classes_) k = Class{};
}

void Placement::set_mode(PlacementMode m) { mode_ = m; }

PlacementReport Placement::report() const {
  PlacementReport r;
  r.mode = mode_;
  r.far = mode_ == PlacementMode::kAuto ? current_far_ : mode_ == PlacementMode::kFar;
  for (int i = 0; i < kClasses; ++i) {
    const Class& k = classes_[i];
    if (k.calls == 0) continue;
    PlacementClass pc;
    pc.min_bytes = int64_t(1) << (i % kSizes);
    pc.registered = i / kSizes == int(PlacedSchedule::kRegistered);
    pc.one_shot = i / kSizes == int(PlacedSchedule::kOneShot);
    pc.decided = k.decided;
    pc.far = k.far;
    pc.settled = k.settled;
    pc.pairs = k.pairs;
    pc.calls = k.calls;
    if (k.pairs > 0) {
      pc.near_us = median_of(k.near_us, k.pairs);
      pc.far_us = median_of(k.far_us, k.pairs);
      pc.ratio = std::exp(median_sorted(log_ratios(k.near_us, k.far_us, k.pairs)));
    } else {
      for (int j = 0; j < k.batch; ++j) {  // this rank's own trials so far
        const int pair = j / 2;
        const bool far = ((j % 2) == 1) != ((pair % 2) == 1);
        double& best = far ? pc.far_us : pc.near_us;
        if (best == 0 || k.mine[j] < best) best = k.mine[j];
      }
    }
    r.classes.push_back(pc);
  }
  r.decisions = decisions_;
  r.revisits = revisits_;
  r.rechecks = rechecks_;
  r.checks = checks_;
  r.calls = calls_;
  return r;
}

}  // namespace cpu_shm
}  // namespace fastpar
