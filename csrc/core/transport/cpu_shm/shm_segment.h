// One POSIX shared-memory segment: create (owner), map (peers), unlink.
//
// Lifetime rule that keeps /dev/shm clean even under SIGKILL: a segment's name
// exists only between shm_open(O_CREAT|O_EXCL) and the store barrier after which
// every rank has mapped every segment; then every rank unlinks every name
// (ENOENT is fine: someone else was first). From then on the memory lives
// exactly as long as some process maps it, and the kernel frees it when the
// last one exits, however it exits.
#pragma once

#include <cstddef>
#include <string>

namespace fastpar {
namespace cpu_shm {

class Segment {
 public:
  Segment() = default;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  Segment(Segment&& o) noexcept { *this = std::move(o); }
  Segment& operator=(Segment&& o) noexcept;
  ~Segment();

  // Creates `name` (must not exist) of `bytes` and maps it read-write.
  static Segment create(const std::string& name, size_t bytes);
  // Maps an existing segment created by a peer; `bytes` must match its size.
  static Segment open(const std::string& name, size_t bytes);

  char* data() const { return base_; }
  size_t size() const { return bytes_; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  char* base_ = nullptr;
  size_t bytes_ = 0;
};

// shm_unlink that ignores ENOENT; returns false (never throws) on other errors
// so it is safe on error paths.
bool unlink_segment(const std::string& name);

// A name no other job can produce: prefix, 16 hex digits from /dev/urandom
// (the job id, shared by all ranks of a job), the rank and the pid.
std::string random_job_id();
std::string segment_name(const std::string& job_id, int rank);

// The prefix of every fastpar segment name (tests look for it in /dev/shm).
constexpr const char* kSegmentPrefix = "fastpar_";

}  // namespace cpu_shm
}  // namespace fastpar
