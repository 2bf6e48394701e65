// Where a group's ranks sit, as the shared-memory allreduce feels it: whether
// a cache line one rank writes reaches another rank faster from the writer's
// cache ("near": one last-level cache) or from memory ("far": the ranks on
// different dies or sockets, where every line that crosses between two
// caches is several times slower, docs/notes/cpu-slow-mode.md).
//
// The two allreduce forms this chooses between run the same schedule with
// the same element math (so the same bits); they differ in how lines cross:
//   near  the pipelined two-shot as it is: slots written with ordinary stores,
//         peers read them from the writer's cache;
//   far   the same schedule with streaming (non-temporal) stores for every
//         byte a peer reads (the input shards published into the slots, the
//         reduced shards): peers read them from memory, and no line moves
//         between the two caches.
// Measured on a VM whose host sometimes places its two vCPUs apart: streaming
// stores were 1.6x faster there and 1.4x slower in the normal placement, and
// which one wins also depends on the size (whether a call's data stays in the
// caches). So the choice is made by measuring the calls themselves, per group
// and per size class (a power of two of bytes), never imposed:
//   - the first kTrials calls of a class alternate near, far, near, far; each
//     rank keeps its best time of each form; at the class's next call every
//     rank's times go to every rank (one 16-byte allgather) and all take the
//     same decision from the slowest rank's: far only when near is more than
//     kFarMargin slower;
//   - afterwards each rank watches the rate of the class's calls against the
//     median of its first calls after the decision; every kCheckEvery calls
//     of the two-shot family the ranks compare notes (one 8-byte allgather)
//     and, if any rank's rate moved kDrift either way (the placement changed
//     under the group: the host moved the CPUs, a rank was migrated), every
//     class is measured again.
// FASTPAR_SHM_PLACEMENT=near|far forces a form (no trials), auto measures.
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

// One size class as measured: the slowest rank's best call of each form.
struct PlacementClass {
  int64_t min_bytes = 0;  // the class: calls of [min_bytes, 2 * min_bytes)
  bool decided = false;
  bool far = false;
  double near_us = 0, far_us = 0;
};

// What a group's allreduce runs and why (fastpar.distributed.placement()).
struct PlacementReport {
  PlacementMode mode = PlacementMode::kAuto;
  bool far = false;  // the form the latest large call ran
  std::vector<PlacementClass> classes;  // auto: the classes seen, smallest first
  int64_t decisions = 0;  // decisions taken (a class measured again counts again)
  int64_t checks = 0;     // drift agreements held
  int64_t large_calls = 0;
};

// Per communicator: the choice and the drift watch. Not thread-safe (the
// engine serializes calls). Every rank must call choose() and record() for the
// same calls: those of the two-shot family, which every rank runs for the same
// sizes (the descriptor check enforces it).
class Placement {
 public:
  explicit Placement(PlacementMode mode = PlacementMode::kAuto) : mode_(mode) {}

  // Collective (inside an allreduce of `bytes`, after ShmComm::begin): whether
  // this call runs the far form. May exchange a few bytes with the peers (a
  // decision, a drift check) before the call's own phases.
  bool choose(ShmComm& c, int64_t bytes);
  // After the call: its duration, for the trials and the drift watch.
  void record(uint64_t ns);
  // Tests: this rank saw drift (as record() would); every class is measured
  // again after the next check.
  void mark_drifted() { drifted_ = true; }

  // Benchmarks and tests force or release the choice at run time (every rank
  // must set the same); auto measures every class again.
  void set_mode(PlacementMode m);
  PlacementReport report() const;

  static constexpr int kTrials = 4;         // near, far, near, far
  static constexpr double kFarMargin = 1.1;  // far only when near is this much slower
  static constexpr int64_t kCheckEvery = 32;
  // A class's rate that moves this far (either way) from its reference counts
  // as drift: a placement change moved it 1.9-5x where it was measured.
  static constexpr double kDrift = 1.8;

 private:
  static constexpr int kClasses = 48;
  static constexpr int kRefCalls = 5;
  struct Class {
    int trials = 0;  // calls run so far in the trials (kTrials: waiting for the decision)
    bool decided = false, far = false;
    double best_us[2] = {0, 0};  // this rank's best call per form during the trials (0: none)
    double agreed_us[2] = {0, 0};  // the slowest rank's, at the decision
    // The drift watch: the median rate (ns per byte) of the first kRefCalls
    // calls after the decision, and a running mean since.
    double first[kRefCalls];
    int n = 0;
    double ref = 0, mean = 0;
  };
  void decide(ShmComm& c, Class& k);
  bool agree_drift(ShmComm& c);
  void reset();

  PlacementMode mode_;
  Class classes_[kClasses];
  int current_ = -1;        // the class of the call between choose() and record()
  bool current_far_ = false;
  bool current_trial_ = false;
  bool drifted_ = false;
  int64_t bytes_ = 0;
  int64_t decisions_ = 0, checks_ = 0, large_calls_ = 0;
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
