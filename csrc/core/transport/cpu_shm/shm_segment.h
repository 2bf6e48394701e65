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
#include <cstdint>
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

  // Creates `name` (must not exist) of `bytes` and maps it read-write. The
  // file is sparse: no memory is reserved until reserve() (or a first touch).
  static Segment create(const std::string& name, size_t bytes);
  // Maps an existing segment created by a peer; `bytes` must match its size.
  static Segment open(const std::string& name, size_t bytes);

  char* data() const { return base_; }
  size_t size() const { return bytes_; }
  const std::string& name() const { return name_; }

  // Owner only (create()): backs [offset, offset + bytes) with memory now
  // (fallocate), so that touching it later cannot SIGBUS on a full /dev/shm.
  // Returns 0 or the errno (ENOSPC when /dev/shm has no room).
  int reserve(int64_t offset, int64_t bytes) const;
  // Owner only: gives the memory of [offset, offset + bytes) back to /dev/shm
  // (reads then see zeros); whole pages only, best effort.
  void release(int64_t offset, int64_t bytes) const;
  // Bytes free in the file system that holds the segment (/dev/shm), and its
  // size; -1 when unknown.
  int64_t fs_free_bytes() const;
  int64_t fs_total_bytes() const;

 private:
  std::string name_;
  char* base_ = nullptr;
  size_t bytes_ = 0;
  int fd_ = -1;  // kept open by the owner for reserve() / release()
};

// shm_unlink that ignores ENOENT; returns false (never throws) on other errors
// so it is safe on error paths. Only ever called with this process's own
// names or names that passed parse_segment_name.
bool unlink_segment(const std::string& name);

// Which process created a segment, in a form that survives pid reuse: the
// pid, the process's start time (clock ticks since boot, /proc/<pid>/stat
// field 22) and the inode of its pid namespace (/proc/self/ns/pid). 0 where
// unknown; such a process is never judged dead.
struct ProcessId {
  int64_t pid = 0;
  uint64_t start = 0;
  uint64_t pidns = 0;
};
// This process (read once per call: a forked child gets its own).
ProcessId this_process();
// "<pid>_t<start>_n<pidns>" and back; parse accepts only what format writes
// (decimal, no leading zeros, a pid in 1..INT32_MAX).
std::string format_process(const ProcessId& id);
bool parse_process(const std::string& text, ProcessId* id);
// Whether `id` has provably exited: it is in this process's pid namespace and
// /proc/<pid> is gone (kill says ESRCH), or holds another process (another
// start time: the pid was reused), or a zombie / an exiting process. False
// whenever that cannot be told (another pid namespace, /proc unreadable, a
// field unknown): callers unlink only on true, so a live process's segment is
// never removed.
bool process_gone(const ProcessId& id);

// A name no other job can produce: prefix, 16 hex digits from /dev/urandom
// (the job id, shared by all ranks of a job), the rank and the creator's
// ProcessId: fastpar_<job>_r<rank>_p<pid>_t<start>_n<pidns>. The ProcessId
// lets survivors of a failed init, and later groups on the host, tell a dead
// creator's leftover from a live process's segment.
std::string random_job_id();
std::string segment_name(const std::string& job_id, int rank, const ProcessId& creator);

// Whether `job_id` has the form random_job_id() gives (16 lowercase hex digits).
bool valid_job_id(const std::string& job_id);
// Whether `name` is exactly segment_name(job_id, rank, *creator) of some
// process; its ProcessId goes to *creator. Names read from the store are only
// opened or unlinked when this holds: anyone who can reach the store can
// write to it.
bool parse_segment_name(const std::string& name, const std::string& job_id, int rank, ProcessId* creator);
// Whether `name` is segment_name() of any job and rank (for the sweep).
bool parse_any_segment_name(const std::string& name, ProcessId* creator);
// Unlinks the /dev/shm entries of this user that segment_name() wrote for a
// process that is gone (process_gone): what a rank killed during init (no
// survivor could clean it) left. Never touches another user's entry, an
// entry of another pid namespace or of a live process, or any other name.
// Returns how many it unlinked; never throws.
int sweep_dead_segments();
// `value` for an error message: at most `max` characters, non-printable bytes as \xNN.
std::string printable(const std::string& value, size_t max = 80);

// The prefix of every fastpar segment name (tests look for it in /dev/shm).
constexpr const char* kSegmentPrefix = "fastpar_";

}  // namespace cpu_shm
}  // namespace fastpar
