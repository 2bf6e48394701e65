// Whether a process of this host is still running, from /proc/<pid>/stat.
// Torch-free and CUDA-free: the CUDA IPC backend's peer watcher uses it, and
// ctest checks it (tests/cpp/test_peer_watcher.cpp); the CPU shared-memory
// transport (cpu_shm/shm_comm.cpp) uses it too.
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

namespace fastpar {
namespace liveness {

// Dead means gone or a zombie: a SIGKILLed child stays a zombie until its
// parent reaps it, and kill(pid, 0) still succeeds on a zombie, so the state
// letter after the command name is what tells. The name may hold ')' and
// spaces, hence the last ')'.
inline bool process_alive(int64_t pid) {
  if (pid <= 0) return false;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%lld/stat", static_cast<long long>(pid));
  std::ifstream f(path);
  if (!f) return false;
  const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t p = s.rfind(')');
  if (p == std::string::npos || p + 2 >= s.size()) return true;  // unreadable format: never call it dead
  const char state = s[p + 2];
  return state != 'Z' && state != 'X' && state != 'x';
}

}  // namespace liveness
}  // namespace fastpar
