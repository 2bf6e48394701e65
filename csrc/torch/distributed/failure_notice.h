// How the ranks of a group on several hosts learn that the group has failed.
//
// Inside a host a rank learns of a failed peer within milliseconds: the peer
// aborted the shared memory, or /proc says its process is gone. Between hosts
// a rank learns only what gloo tells it: at once when the peer's process dies
// (its kernel resets the connection), but nothing when the peer lives on. A
// rank whose call failed goes on to its next call, and a rank on another host
// that waits for it in a gloo call waits out the whole timeout (a gloo call
// cannot be aborted), and may do so again in a later call: with torch's
// default timeout of 30 minutes, an hour before it hears of a failure.
//
// So a rank whose call fails writes its error under one key of the group's
// store (the first write stays: the first failure, not the timeouts it
// caused), and a rank that waits for a gloo call between hosts through a
// whole tick of the poll interval looks for that key. Finding it, it stops
// waiting and raises with that error; every later call of the group raises
// at once. PyTorch's NCCL backend has used its store the same way, to tell
// the other ranks of a communicator it aborted (its NCCLABORTEDCOMM key).
//
// The store is read and written on a thread of the notice's own (started at
// the first wait or failure): a waiter never waits for the store. A store
// that cannot be reached (its host is gone) leaves the waiters as they were,
// bound by gloo's timeout. Polling costs one store lookup per interval, and
// only while one call waits that long; the thread sleeps while no call
// waits, and a call does not wake it unless it sleeps.
// FASTPAR_HOSTS_FAILURE_POLL_MS sets the interval; 0 turns the notice off
// (docs/faults.md).
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
