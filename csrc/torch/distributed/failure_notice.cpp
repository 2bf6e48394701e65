#include "failure_notice.h"

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <thread>
#include <utility>
#include <vector>

namespace fastpar {
namespace distributed {

struct FailureNotice::State {
  State(c10::intrusive_ptr<c10d::Store> s, std::chrono::milliseconds p) : store(std::move(s)), poll(p) {}
  const c10::intrusive_ptr<c10d::Store> store;  // only the thread uses it
  const std::chrono::milliseconds poll;
  std::mutex mu;
  std::condition_variable waiters;  // a Work completed, or the failure became known
  std::condition_variable thread;   // something for the thread to do, or stop
  int waiting = 0;                  // calls in wait()
  uint64_t waits = 0;               // calls that have entered wait()
  bool started = false, stop = false;
  bool asleep = false;  // the thread sleeps until a call waits (it ticks otherwise)
  bool store_failed = false;  // see write()
  std::optional<std::string> known;    // the group's failure
  std::optional<std::string> to_post;  // this rank's, not yet written
};

namespace {

// write() and read() return false where the store failed: it is gone (the
// process that served it died: with init_process_group's env:// store, rank 0
// of the job) or lost, and the group is left to learn of failures from gloo,
// as without the notice. A TCPStore client does not reconnect, so the notice
// asks no more.
bool write(c10d::Store& store, const std::string& why) {
  const std::vector<uint8_t> value(why.begin(), why.end());
  try {
    store.compareSet(FailureNotice::kKey, {}, value);  // only where no failure was written before
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

bool read(c10d::Store& store, std::optional<std::string>* found) {
  try {
    if (store.check({FailureNotice::kKey})) {
      const auto v = store.get(FailureNotice::kKey);
      *found = std::string(v.begin(), v.end());
    }
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

// The group's store itself, not a clone: a clone is one more connection to
// the store's server per rank and group, and a job's ranks times its groups
// can run past the server's file limit. The store client is thread-safe; a
// request of the thread's that hangs on a lost store holds it only while the
// store is lost for everyone in the process.
FailureNotice::FailureNotice(c10::intrusive_ptr<c10d::Store> store, std::chrono::milliseconds poll)
    : state_(std::make_shared<State>(std::move(store), poll)) {}

FailureNotice::~FailureNotice() {
  {
    std::lock_guard<std::mutex> g(state_->mu);
    state_->stop = true;
  }
  state_->thread.notify_all();
}

void FailureNotice::start(const std::shared_ptr<State>& s) {
  if (s->started) return;
  s->started = true;
  std::thread([s] { run(s); }).detach();
}

void FailureNotice::post(const std::string& why) {
  {
    std::lock_guard<std::mutex> g(state_->mu);
    if (state_->known) return;
    state_->known = why;
    state_->to_post = why;
    start(state_);
  }
  state_->thread.notify_all();
  state_->waiters.notify_all();
}

std::optional<std::string> FailureNotice::known() const {
  std::lock_guard<std::mutex> g(state_->mu);
  return state_->known;
}

FailureNotice::Waited FailureNotice::wait(c10d::Work& work, std::chrono::milliseconds timeout) {
  const auto& s = state_;
  if (work.isCompleted()) return Waited::kCompleted;  // no Future callback to set up for a call already done
  c10::intrusive_ptr<c10::ivalue::Future> future;
  try {
    future = work.getFuture();
  } catch (const c10::Error&) {
    return Waited::kCompleted;  // no Future to wait on
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  future->addCallback([s, done](c10::ivalue::Future&) {
    {
      std::lock_guard<std::mutex> g(s->mu);  // so that a waiter cannot miss the notification
      done->store(true);
    }
    s->waiters.notify_all();
  });
  std::unique_lock<std::mutex> lock(s->mu);
  const auto over = [&] { return done->load() || s->known.has_value(); };
  if (!over()) {
    ++s->waiting;
    ++s->waits;
    start(s);
    if (s->asleep) s->thread.notify_all();  // not on every call: waking a thread costs more than a short call
    if (timeout.count() == 0) s->waiters.wait(lock, over);  // c10d::Work's kNoTimeout
    else s->waiters.wait_for(lock, timeout, over);
    --s->waiting;
  }
  if (done->load()) return Waited::kCompleted;
  return s->known ? Waited::kFailed : Waited::kTimedOut;
}

void FailureNotice::run(const std::shared_ptr<State>& s) {
  std::unique_lock<std::mutex> lock(s->mu);
  while (!s->stop) {
    if (s->to_post) {
      const std::string why = *s->to_post;
      s->to_post.reset();
      if (s->store_failed) continue;
      lock.unlock();
      const bool ok = write(*s->store, why);
      lock.lock();
      s->store_failed = !ok;
      continue;
    }
    const auto busy = [&] { return s->stop || s->to_post.has_value(); };
    if (s->known || s->store_failed) {  // nothing left to look for
      s->thread.wait(lock, busy);
      continue;
    }
    // One tick. The store is read only for a call that has waited through a
    // whole tick: a call was waiting when it began and when it ended, and no
    // call began in between. A tick with no call at all puts the thread to
    // sleep until a call waits.
    const uint64_t waits = s->waits;
    const bool waited = s->waiting > 0;
    if (s->thread.wait_for(lock, s->poll, busy)) continue;
    if (!waited && s->waiting == 0 && s->waits == waits) {
      s->asleep = true;
      s->thread.wait(lock, [&] { return busy() || s->waiting > 0; });
      s->asleep = false;
      continue;
    }
    if (!waited || s->waiting == 0 || s->waits != waits) continue;
    lock.unlock();
    std::optional<std::string> found;
    const bool ok = read(*s->store, &found);
    lock.lock();
    s->store_failed = !ok;
    if (found && !s->known) {
      s->known = "the group failed on another rank: " + *found;
      s->waiters.notify_all();
    }
  }
}

}  // namespace distributed
}  // namespace fastpar
