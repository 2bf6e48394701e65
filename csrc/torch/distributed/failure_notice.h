// How the ranks of a group on several hosts learn that the group has failed,
// where gloo alone would leave a rank waiting in a call between hosts (which
// cannot be aborted) until its timeout; docs/faults.md tells the whole story.
//
// Contract: a rank whose call fails posts its error under kKey in the group's
// store; the first post stays (the failure, not the timeouts it caused). A
// rank waiting in a gloo call between hosts for a whole poll interval looks
// for the key; finding it, that call and every later call of the group raise
// that error. The store is touched only on the notice's own thread, so a
// waiter never waits for the store, and an unreachable store leaves waiters
// bound by gloo's timeout. FASTPAR_HOSTS_FAILURE_POLL_MS sets the interval;
// 0 turns the notice off.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace fastpar {
namespace distributed {

class FailureNotice {
 public:
  // The key, under the group's store.
  static constexpr const char* kKey = "fastpar/failed";

  FailureNotice(c10::intrusive_ptr<c10d::Store> store, std::chrono::milliseconds poll);
  // Stops the thread without waiting for it: it may be in a store request
  // that waits for a lost store, and ends when that does.
  ~FailureNotice();
  FailureNotice(const FailureNotice&) = delete;
  FailureNotice& operator=(const FailureNotice&) = delete;

  // This rank's call failed with `why`: tells the group, unless a failure is
  // known already. Does not wait for the store.
  void post(const std::string& why);
  // The group's failure this rank knows of (its own, or one another rank
  // posted), or nullopt.
  std::optional<std::string> known() const;

  enum class Waited { kCompleted, kFailed, kTimedOut };
  // Waits until `work` completes, `timeout` passes (0, kNoTimeout: no
  // limit) or the group's failure is known (kFailed). A Work without a
  // Future (gloo's send and recv) counts as completed at once: the caller
  // waits for it as before.
  Waited wait(c10d::Work& work, std::chrono::milliseconds timeout);

 private:
  struct State;
  static void start(const std::shared_ptr<State>& s);  // the thread, once; with s->mu held
  static void run(const std::shared_ptr<State>& s);    // its loop

  // Shared with the thread and with the Futures' callbacks, which may outlive this.
  std::shared_ptr<State> state_;
};

}  // namespace distributed
}  // namespace fastpar
