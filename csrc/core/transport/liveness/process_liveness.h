// Whether a process of this host is still running, from /proc/<pid>/stat.
// Torch-free and CUDA-free: the CUDA IPC backend's peer watcher uses it, and
// ctest checks it (tests/cpp/test_peer_watcher.cpp); the CPU shared-memory
// transport (cpu_shm/shm_comm.cpp) uses it too.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

namespace fastpar {
namespace liveness {

// Whether the text of /proc/<pid>/stat says the process still runs. Dead
// means gone, a zombie, or exiting: a SIGKILLed child stays a zombie until
// its parent reaps it (and kill(pid, 0) still succeeds on a zombie), so the
// state letter after the command name is what tells; and a process that has
// begun to exit (PF_EXITING in the flags field, set by do_exit before it
// releases anything) can stay in its exit for seconds while the GPU driver
// tears its CUDA context down. Under MPS that teardown may wait for the GPU
// work of the MPS server's other clients, i.e. for the survivors' kernels
// that spin on the dead rank's flags and stop only when the watcher raises
// the host abort word: waiting for the zombie would make each wait on the
// other until the flag-wait timeout. The name may hold ')' and spaces, hence
// the last ')'.
inline bool stat_says_alive(const std::string& s) {
  constexpr unsigned long kPfExiting = 0x4;  // include/linux/sched.h
  const size_t p = s.rfind(')');
  if (p == std::string::npos || p + 2 >= s.size()) return true;  // unreadable format: never call it dead
  const char state = s[p + 2];
  if (state == 'Z' || state == 'X' || state == 'x') return false;
  // After the state: ppid pgrp session tty_nr tpgid flags (fields 4-9).
  const char* c = s.c_str() + p + 3;
  for (int field = 4; field < 9; ++field) {
    while (*c == ' ') ++c;
    while (*c != ' ' && *c != '\0') ++c;
  }
  char* end = nullptr;
  const unsigned long flags = std::strtoul(c, &end, 10);
  if (end == c) return true;  // no flags field: judge by the state alone
  return (flags & kPfExiting) == 0;
}

inline bool process_alive(int64_t pid) {
  if (pid <= 0) return false;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%lld/stat", static_cast<long long>(pid));
  std::ifstream f(path);
  if (!f) return false;
  const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return stat_says_alive(s);
}

}  // namespace liveness
}  // namespace fastpar
