// A host thread that watches the peer processes of a communicator and, when
// one dies, calls `on_dead(rank)` once. The CUDA IPC backend needs it because
// its flag waits run inside kernels: a kernel cannot read /proc, so without a
// watcher a SIGKILLed peer is noticed only when the kernel's flag wait reaches
// its deadline (the group timeout, minutes by default). The CPU shm transport
// reads /proc from the waiting thread itself and needs no watcher.
//
// Peers are watched only if they are alive when the watch starts: a peer in
// another pid namespace (containers sharing the GPU) is not in our /proc and
// must never be called dead; the group timeout still covers it.
//
// Torch-free and CUDA-free (ctest: tests/cpp/test_peer_watcher.cpp).
#pragma once

#include <atomic>
#include <chrono>
#include <unistd.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "process_liveness.h"

namespace fastpar {
namespace liveness {

class PeerWatcher {
 public:
  // /proc/<pid>/stat of every peer is read this often: 7 small reads per
  // 100 ms is negligible host work, and 100 ms is far below any timeout.
  static constexpr std::chrono::milliseconds kDefaultPeriod{100};

  PeerWatcher() = default;
  ~PeerWatcher() { stop(); }
  PeerWatcher(const PeerWatcher&) = delete;
  PeerWatcher& operator=(const PeerWatcher&) = delete;

  // pids[q] is rank q's pid; pids[self] is not watched. `on_dead` runs on the
  // watcher thread, once, for the first dead rank found (lowest rank first).
  void start(std::vector<int64_t> pids, int self, std::function<void(int)> on_dead,
             std::chrono::milliseconds period = kDefaultPeriod) {
    stop();
    pids_ = std::move(pids);
    watched_.assign(pids_.size(), false);
    for (size_t q = 0; q < pids_.size(); ++q) watched_[q] = int(q) != self && process_alive(pids_[q]);
    on_dead_ = std::move(on_dead);
    stopping_ = false;
    owner_pid_ = getpid();
    thread_ = std::thread([this, period] { loop(period); });
  }

  // Joins the thread (returns at once: the sleep is a condition wait). In a
  // child forked after start() (a DataLoader worker destroying its copy of
  // the backend) the thread does not exist: joining it could hang, so the
  // handle is only released there.
  void stop() {
    if (thread_.joinable() && getpid() != owner_pid_) {
      thread_.detach();
      return;
    }
    {
      std::lock_guard<std::mutex> g(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // The rank found dead, or -1; and its pid.
  int dead_rank() const { return dead_rank_.load(std::memory_order_acquire); }
  int64_t pid_of(int rank) const {
    return rank >= 0 && size_t(rank) < pids_.size() ? pids_[size_t(rank)] : -1;
  }

  // One look at every watched peer, from any thread: the first dead rank, or
  // -1. Does not call on_dead.
  int scan() const {
    for (size_t q = 0; q < pids_.size(); ++q)
      if (watched_[q] && !process_alive(pids_[q])) return int(q);
    return -1;
  }

 private:
  void loop(std::chrono::milliseconds period) {
    std::unique_lock<std::mutex> g(mu_);
    while (!stopping_) {
      g.unlock();
      const int dead = scan();
      g.lock();
      if (dead >= 0 && !stopping_) {
        dead_rank_.store(dead, std::memory_order_release);
        g.unlock();
        if (on_dead_) on_dead_(dead);
        return;  // one report; the communicator is unusable from here on
      }
      cv_.wait_for(g, period, [this] { return stopping_; });
    }
  }

  std::vector<int64_t> pids_;
  std::vector<bool> watched_;
  std::function<void(int)> on_dead_;
  std::atomic<int> dead_rank_{-1};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  pid_t owner_pid_ = 0;
  std::thread thread_;
};

}  // namespace liveness
}  // namespace fastpar
