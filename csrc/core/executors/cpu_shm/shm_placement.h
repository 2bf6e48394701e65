// Where a group's ranks sit, as the shared-memory allreduce feels it: whether
// a cache line one rank writes reaches another rank faster from the writer's
// cache ("near": one last-level cache) or from memory ("far": the ranks on
// different dies or sockets, where every line that crosses between two
// caches is several times slower, docs/notes/cpu-slow-mode.md).
//
// The two forms of each allreduce schedule (one-shot, pipelined two-shot,
// registered) this chooses between run the same steps with the same element
// math (so the same bits); they differ in how lines cross:
//   near  the schedule as it is: slots written with ordinary stores, peers
//         read them from the writer's cache;
//   far   the same steps with streaming (non-temporal) stores for every byte
//         a peer reads (the inputs published into the slots, the two-shot's
//         reduced shards): peers read them from memory, and no line moves
//         between the two caches.
// The registered-buffer schedule reads its peers' tensors where their owners
// wrote them, in the owners' caches, whatever its own stores, so a registered
// buffer's far form is the copying two-shot's far form: with the cores apart
// it measured much faster than the zero-copy schedule in either
// form, and with the cores together the zero-copy near form was the fastest
// or tied (docs/measurements.md, "Registered buffers with the cores apart").
// Which form wins depends on where the host placed the ranks' cores (on a VM
// it changes while a job runs; docs/measurements.md), on the size (whether a
// call's data stays in the caches) and on the schedule. So the choice is made by measuring the calls themselves, per group,
// per schedule and per size class (a power of two of bytes), never imposed:
//   - a class's first calls are paired trials: near then far, far then near,
//     alternating (a trend of the machine cancels within a pair). Every
//     kBatchPairs pairs, at the class's next call, every rank's times go to
//     every rank (one allgather of the batch) and each call counts at its
//     fastest rank's time (the rank that arrived last: the call's own
//     duration, without the wait for a late peer);
//   - from kMinPairs pairs on, all ranks apply the same test to the same
//     numbers: the log of far/near per pair, its median and the sign test's
//     90% interval of the median. Decided, "settled", when the interval lies
//     on one side of 1 (that form) or inside [1/kEquivalent, kEquivalent] (the
//     forms are within 10%: the median's form). Otherwise more pairs, up to
//     kMaxPairs: then the median's form, unsettled (taken under noise), and
//     the class is measured again after kRevisitCalls of its calls, twice as
//     many after each further unsettled decision;
//   - a settled class is measured again too, after kRecheckCalls of its
//     calls, twice as many after each re-check that confirms its form (at most
//     kRecheckMaxCalls), kRecheckCalls again after one that changes it: the
//     drift watch below sees only the chosen form's rate, and far keeps its
//     rate in either placement, so near becoming the faster form shows only
//     in a new measurement;
//   - afterwards each rank watches the median rate of each window of the
//     class's calls against the median of its first calls after the
//     decision; every kCheckEvery calls or more (kCheckBytes of them, or
//     kCheckMaxCalls) the ranks compare notes (one allgather of a bit mask)
//     and every class whose rate moved kDrift either way on any rank (the
//     placement changed under the group: the host moved the CPUs, a rank was
//     migrated) is measured again; a class the move did not reach keeps its
//     decision, so a busy moment costs no trials of the other classes.
// FASTPAR_SHM_PLACEMENT=near|far forces a form (no trials), auto measures;
// forcing a form at run time keeps what auto measured, for when it returns.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../../kernels/cpu_reduce.h"  // stream_copy
#include "../../transport/cpu_shm/shm_comm.h"

namespace fastpar {
namespace cpu_shm {

enum class PlacementMode : int { kAuto = 0, kNear = 1, kFar = 2 };

// "auto" / "near" / "far" -> the mode; throws std::invalid_argument naming
// `what` and the value otherwise.
PlacementMode parse_placement_mode(const std::string& s, const char* what);
const char* placement_mode_name(PlacementMode m);

// One size class of one schedule as measured.
struct PlacementClass {
  int64_t min_bytes = 0;    // the class: calls of [min_bytes, 2 * min_bytes)
  bool registered = false;  // a registered buffer's: zero-copy (near) or the copying two-shot's far form
  bool one_shot = false;    // the one-shot (neither: the copying two-shot)
  bool decided = false;
  bool far = false;
  bool settled = false;  // decided by the test (else at kMaxPairs, under noise: measured again later)
  int pairs = 0;         // agreed paired trials behind near_us / far_us / ratio
  int64_t calls = 0;     // calls of this class
  // The medians over the agreed pairs (each call at its fastest rank's time);
  // before the first agreement, this rank's own best of each form (0: none yet).
  double near_us = 0, far_us = 0;
  double ratio = 0;  // the median of far / near over the pairs (0: no pair yet)
};

// What a group's allreduce runs and why (fastpar.distributed.placement()).
struct PlacementReport {
  PlacementMode mode = PlacementMode::kAuto;
  bool far = false;  // the form the latest call ran
  std::vector<PlacementClass> classes;  // auto: the classes seen, two-shot, registered, one-shot, smallest first
  int64_t decisions = 0;  // decisions taken (a class measured again counts again)
  int64_t revisits = 0;   // unsettled decisions measured again
  int64_t rechecks = 0;   // settled decisions measured again
  int64_t checks = 0;     // drift agreements held
  int64_t calls = 0;
};

// The schedules whose classes are measured apart.
enum class PlacedSchedule : int { kTwoShot = 0, kRegistered = 1, kOneShot = 2 };

// Per communicator: the choice and the drift watch. Not thread-safe (the
// engine serializes calls). Every rank must call choose() and record() for the
// same calls: every allreduce, which every rank runs for the same sizes and
// schedule (the descriptor check enforces it).
class Placement {
 public:
  explicit Placement(PlacementMode mode = PlacementMode::kAuto) : mode_(mode) {}

  // Collective (inside an allreduce of `bytes`, after ShmComm::begin): whether
  // this call runs the far form. May exchange a few bytes with the peers (a
  // batch of trials, a drift check) before the call's own phases.
  bool choose(ShmComm& c, int64_t bytes, PlacedSchedule schedule = PlacedSchedule::kTwoShot);
  // After the call: its duration, for the trials and the drift watch.
  void record(uint64_t ns);
  // Tests: this rank saw drift in every class it has run (as record() would);
  // they are measured again after the next check.
  void mark_drifted();
  // Tests: make a form measurably slower, or the measurement noisy: record()
  // spins near_us / far_us after each call of that form, and noise_us after
  // every other call of either form (counted from this setting), and counts
  // the spin in the call's time; revisit_calls > 0 replaces kRevisitCalls,
  // recheck_calls > 0 kRecheckCalls.
  // Every rank must set the same, or a late rank shifts its wait onto its
  // peers' next call.
  void set_test_hooks(double near_us, double far_us, double noise_us, int64_t revisit_calls,
                      int64_t recheck_calls = 0);

  // Benchmarks and tests force or release the choice at run time (every rank
  // must set the same); the classes auto measured stay for its return.
  void set_mode(PlacementMode m);
  PlacementReport report() const;

  static constexpr int kBatchPairs = 4;   // pairs per agreement
  static constexpr int kMinPairs = 8;     // the first test (the sign test's 90% interval needs >= 6)
  static constexpr int kMaxPairs = 32;
  static constexpr double kEquivalent = 1.1;  // forms within 10%: either will do
  static constexpr int64_t kRevisitCalls = 256;
  static constexpr int64_t kRecheckCalls = 4096;
  static constexpr int64_t kRecheckMaxCalls = 65536;
  // A drift check after at least kCheckEvery calls and kCheckBytes of them,
  // or kCheckMaxCalls calls: one allgather per ~1% of small calls' time.
  static constexpr int64_t kCheckEvery = 32;
  static constexpr int64_t kCheckBytes = int64_t(512) << 10;
  static constexpr int64_t kCheckMaxCalls = 4096;
  // A class's rate that moves this far (either way) from its reference counts
  // as drift: well beyond a busy moment, well below a placement change.
  static constexpr double kDrift = 1.8;

 private:
  static constexpr int kSizes = 48;
  static constexpr int kClasses = 3 * kSizes;  // PlacedSchedule's order
  static constexpr int kRefCalls = 5;
  static constexpr int kWatchCalls = 8;
  struct Class {
    int batch = 0;  // trial calls run in the current batch (2 * kBatchPairs: waiting for the agreement)
    double mine[2 * kBatchPairs];  // this rank's time of each, us
    int pairs = 0;  // agreed pairs
    double near_us[kMaxPairs], far_us[kMaxPairs];  // each at its fastest rank's time
    bool decided = false, far = false, settled = false;
    bool drifted = false;  // this rank saw its rate move since the last check
    int64_t calls = 0;
    int64_t revisit_at = 0;     // decided: the call count at which it is measured again
    int64_t revisit_every = 0;  // the interval of the next unsettled decision (0: kRevisitCalls)
    int64_t recheck_every = 0;  // the interval of the last settled decision (0: none yet)
    int rechecked_form = -1;    // measuring again a settled decision: its form (0 near, 1 far), else -1
    // The drift watch: the median rate (ns per byte) of the first kRefCalls
    // calls after the decision, and the rates of each window of kWatchCalls
    // calls since (their median moves only when most of them do: one call
    // that a busy machine held up is no drift).
    double first[kRefCalls];
    int n = 0;
    double ref = 0;
    double recent[kWatchCalls];
    int64_t watched = 0;
  };
  bool trial_form(const Class& k) const;
  void agree(ShmComm& c, Class& k);
  void test(Class& k);
  bool agree_drift(ShmComm& c);
  void remeasure(Class& k);
  void reset();
  void spin_for_test(uint64_t& ns);

  PlacementMode mode_;
  Class classes_[kClasses];
  int current_ = -1;        // the class of the call between choose() and record()
  bool current_far_ = false;
  bool current_trial_ = false;
  int64_t bytes_ = 0;
  int64_t decisions_ = 0, revisits_ = 0, rechecks_ = 0, checks_ = 0, calls_ = 0;
  int64_t calls_since_check_ = 0, bytes_since_check_ = 0;
  double test_delay_us_[2] = {0, 0}, test_noise_us_ = 0;
  int64_t revisit_calls_ = kRevisitCalls;
  int64_t recheck_calls_ = kRecheckCalls;
  int64_t test_calls_ = 0;
};

// The slot transport of the far form: the communicator, with every publish
// streamed to memory (the reduced shards stream too: the schedule's Reducer
// is told so). Everything else is ShmComm's.
class StreamingSlots {
 public:
  explicit StreamingSlots(ShmComm& c) : c_(c) {}
  int rank() const { return c_.rank(); }
  int size() const { return c_.size(); }
  int64_t slot_bytes() const { return c_.slot_bytes(); }
  char* slot(int q, int k) const { return c_.slot(q, k); }
  char* arena(int q) const { return c_.arena(q); }
  int next_round() { return c_.next_round(); }
  void phase(const CollCall& call) { c_.phase(call); }
  void publish(char* dst, const void* src, int64_t bytes) const {
    if (bytes > 0) stream_copy(dst, src, bytes);
  }
  void copy(void* dst, const void* src, int64_t bytes) const { c_.copy(dst, src, bytes); }

 private:
  ShmComm& c_;
};

}  // namespace cpu_shm
}  // namespace fastpar
