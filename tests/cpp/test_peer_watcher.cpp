// Host-side liveness for the CUDA IPC backend (csrc/core/transport/liveness):
// process_alive reads /proc/<pid>/stat (a SIGKILLed, unreaped child is a
// zombie and counts as dead), and PeerWatcher reports the first dead peer
// once, promptly, ignores peers it could not see when it started (another pid
// namespace), and stops at once.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "check.h"
#include "core/transport/liveness/peer_watcher.h"

using namespace fastpar::liveness;
using Clock = std::chrono::steady_clock;

static pid_t spawn_sleeper() {
  const pid_t pid = fork();
  if (pid == 0) {
    for (;;) pause();
  }
  return pid;
}

static void liveness_of_self_child_and_zombie() {
  CHECK(process_alive(getpid()));
  CHECK(!process_alive(0));
  CHECK(!process_alive(-5));
  const pid_t child = spawn_sleeper();
  CHECK(child > 0);
  CHECK(process_alive(child));
  kill(child, SIGKILL);
  // Not reaped yet: a zombie, which kill(pid, 0) would still call alive.
  bool dead = false;
  for (int i = 0; i < 200 && !dead; ++i) {
    dead = !process_alive(child);
    if (!dead) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(dead);
  CHECK(kill(child, 0) == 0);  // the zombie is still there, which is why /proc is read
  waitpid(child, nullptr, 0);
  CHECK(!process_alive(child));  // gone
}

static void stat_text_states_and_the_exiting_flag() {
  // pid (comm) state ppid pgrp session tty_nr tpgid flags ...
  CHECK(stat_says_alive("42 (python3) R 1 42 42 0 -1 4194304 100 0 0"));
  CHECK(stat_says_alive("42 (python3) S 1 42 42 0 -1 1077936128 100 0 0"));
  CHECK(!stat_says_alive("42 (python3) Z 1 42 42 0 -1 4227340 0 0 0"));
  // SIGKILLed, still in its exit (the driver tearing the CUDA context down): PF_EXITING
  CHECK(!stat_says_alive("42 (python3) D 1 42 42 0 -1 4194308 100 0 0"));
  CHECK(!stat_says_alive("42 (python3) R 1 42 42 0 -1 1077936132 100 0 0"));
  // a name with ") " in it, and one with spaces
  CHECK(stat_says_alive("42 (a) b) R 1 42 42 0 -1 4194304 1"));
  CHECK(!stat_says_alive("42 (pt main thread) D 1 42 42 0 -1 4194308 1"));
  // what cannot be read is never called dead
  CHECK(stat_says_alive("42 (python3"));
  CHECK(stat_says_alive("42 (python3) R 1 42"));
}

static void watcher_reports_the_killed_peer_once() {
  const pid_t a = spawn_sleeper(), b = spawn_sleeper();
  std::atomic<int> calls{0}, reported{-1};
  PeerWatcher w;
  // rank 0 = this process, 1 = a, 2 = b; a 10 ms period keeps the test short.
  w.start({int64_t(getpid()), int64_t(a), int64_t(b)}, 0,
          [&](int rank) {
            ++calls;
            reported = rank;
          },
          std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(w.dead_rank() == -1);
  CHECK(calls == 0);
  const auto t0 = Clock::now();
  kill(b, SIGKILL);
  while (w.dead_rank() < 0 && Clock::now() - t0 < std::chrono::seconds(5))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(w.dead_rank() == 2);
  CHECK(Clock::now() - t0 < std::chrono::seconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  CHECK(calls == 1);
  CHECK(reported == 2);
  CHECK(w.pid_of(2) == int64_t(b));
  CHECK(w.pid_of(7) == -1);
  kill(a, SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(calls == 1);  // one report only
  w.stop();
  waitpid(a, nullptr, 0);
  waitpid(b, nullptr, 0);
}

static void invisible_peers_are_not_watched_and_stop_is_prompt() {
  // A pid that does not exist here stands for a peer in another pid
  // namespace: never reported dead.
  std::atomic<int> calls{0};
  PeerWatcher w;
  w.start({int64_t(getpid()), int64_t(1) << 40}, 0, [&](int) { ++calls; }, std::chrono::milliseconds(10));
  CHECK(w.scan() == -1);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(calls == 0);
  CHECK(w.dead_rank() == -1);
  // The default period is 100 ms; stop() must not wait for it.
  PeerWatcher slow;
  slow.start({int64_t(getpid())}, 0, [](int) {});
  const auto t0 = Clock::now();
  slow.stop();
  CHECK(Clock::now() - t0 < std::chrono::milliseconds(50));
  slow.stop();  // idempotent
}

// A child forked while the watcher runs has no watcher thread: its stop()
// (its copy of the backend being destroyed) must return, not join a thread
// that does not exist there.
static void stop_in_a_forked_child_returns() {
  PeerWatcher w;
  w.start({int64_t(getpid())}, 0, [](int) {}, std::chrono::milliseconds(10));
  const pid_t child = fork();
  if (child == 0) {
    w.stop();
    _exit(0);
  }
  int status = -1;
  bool exited = false;
  for (int i = 0; i < 500 && !exited; ++i) {
    exited = waitpid(child, &status, WNOHANG) == child;
    if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!exited) {
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
  }
  CHECK(exited && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  w.stop();
}

int main() {
  stat_text_states_and_the_exiting_flag();
  liveness_of_self_child_and_zombie();
  watcher_reports_the_killed_peer_once();
  invisible_peers_are_not_watched_and_stop_is_prompt();
  stop_in_a_forked_child_returns();
  return TEST_MAIN_RESULT();
}
