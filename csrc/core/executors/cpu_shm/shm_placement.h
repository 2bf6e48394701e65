// Where a group's ranks sit, as the shared-memory allreduce feels it: whether
// a cache line one rank writes reaches another rank faster from the writer's
// cache ("near": one last-level cache) or from memory ("far": the ranks on
// different dies or sockets, where every line that crosses between two
// caches is several times slower, docs/notes/cpu-slow-mode.md).
//
// The two allreduce schedules this chooses between move the same bytes with
// the same element math (so the same bits); they differ in how lines cross:
//   near  the pipelined two-shot as it is: slots written with ordinary stores,
//         peers read them from the writer's cache;
//   far   the same schedule with streaming (non-temporal) stores for every
//         byte a peer reads (the input shards published into the slots, the
//         reduced shards): peers read them from memory, and no line moves
//         between the two caches.
// Measured on a VM whose host sometimes places its two vCPUs apart: streaming
// stores were 1.6x faster there and 1.4x slower in the normal placement, so
// the choice is made by measurement, per group, never imposed:
//   - at a group's first allreduce that runs the two-shot schedule, every rank
//     times both ways of crossing (probe(): write a slot, peers read it) and
//     all take the same decision from every rank's times;
//   - afterwards each rank watches the rate of its large calls; every
//     kCheckEvery of them the ranks compare notes (one 8-byte allgather) and
//     probe again if any rank's calls drifted (the placement changed under the
//     group: the host moved the CPUs, a rank was migrated).
// FASTPAR_SHM_PLACEMENT=near|far forces a schedule (no probe), auto measures.
#pragma once

#include <cstdint>
#include <string>

#include "../../kernels/cpu_reduce.h"  // stream_copy
#include "../../transport/cpu_shm/shm_comm.h"

namespace fastpar {
namespace cpu_shm {

enum class PlacementMode : int { kAuto = 0, kNear = 1, kFar = 2 };

// "auto" / "near" / "far" -> the mode; throws std::invalid_argument naming
// `what` and the value otherwise.
PlacementMode parse_placement_mode(const std::string& s, const char* what);
const char* placement_mode_name(PlacementMode m);

// One probe's outcome: the slowest rank's best time (over the probe's rounds)
// to publish kProbeBytes into a slot and read a peer's, each way.
struct PlacementProbe {
  double near_us = 0;  // ordinary stores, read from the writer's cache
  double far_us = 0;   // streaming stores, read from memory
};

// What a group's allreduce runs and why (fastpar.distributed.placement()).
struct PlacementReport {
  PlacementMode mode = PlacementMode::kAuto;
  bool measured = false;  // auto: a probe has run (no large allreduce yet: false)
  bool far = false;       // the schedule large allreduces use now
  PlacementProbe last;    // the latest probe (auto)
  int64_t probes = 0;     // probes run (the first included)
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

  // Collective (inside an allreduce, after ShmComm::begin): whether this call
  // runs the far schedule. Probes on the first call and when the ranks agree
  // that calls drifted.
  bool choose(ShmComm& c);
  // After the call: its bytes and duration, for the drift watch.
  void record(int64_t bytes, uint64_t ns);
  // Tests: this rank saw drift (as record() would); all ranks probe again at
  // the next check.
  void mark_drifted();

  // Benchmarks and tests force or release the choice at run time (every rank
  // must set the same); auto probes again at the next large call.
  void set_mode(PlacementMode m);
  PlacementReport report() const;

  // Publish size of a probe and margin of the decision: far only if the
  // near way is this much slower (a noisy probe keeps the plain schedule).
  static constexpr int64_t kProbeBytes = int64_t(1) << 20;
  static constexpr double kFarMargin = 1.15;
  static constexpr int64_t kCheckEvery = 32;
  // A size class's rate that moves this far (either way) from its reference
  // counts as drift: a placement change moves it 1.9-5x (measured).
  static constexpr double kDrift = 1.8;

 private:
  void probe(ShmComm& c);
  bool agree_drift(ShmComm& c);
  void reset_watch();

  PlacementMode mode_;
  bool far_ = false;
  bool measured_ = false;
  PlacementProbe last_;
  int64_t probes_ = 0, checks_ = 0, large_calls_ = 0;
  // The drift watch, per power-of-two size class: the reference rate (the
  // median of its first kRefCalls calls after a decision) and a running mean.
  static constexpr int kClasses = 48;
  static constexpr int kRefCalls = 5;
  struct Watch {
    double first[kRefCalls];
    int n = 0;
    double ref = 0;   // ns per byte; 0 until kRefCalls calls were seen
    double mean = 0;  // exponential mean of ns per byte since the reference
  };
  Watch watch_[kClasses];
  bool drifted_ = false;
};

// The slot transport of the far schedule: the communicator, with every publish
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
