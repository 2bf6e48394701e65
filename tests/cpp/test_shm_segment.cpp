// The cpu_shm segment (csrc/core/transport/cpu_shm/shm_segment.*): which
// names from the store are accepted (only this job's name of the expected
// rank, with a plausible pid: anything else is never opened or unlinked),
// how values are quoted in messages, and reserving / releasing memory of a
// segment (fallocate), including a reservation larger than /dev/shm.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>

#include "check.h"
#include "core/transport/cpu_shm/shm_segment.cpp"  // torch-free; the core build is header-only

using namespace fastpar::cpu_shm;

static void job_ids() {
  CHECK(valid_job_id("0123456789abcdef"));
  CHECK(valid_job_id(random_job_id()));
  CHECK(!valid_job_id("0123456789ABCDEF"));   // upper case is never written
  CHECK(!valid_job_id("0123456789abcde"));    // 15 digits
  CHECK(!valid_job_id("0123456789abcdef0"));  // 17
  CHECK(!valid_job_id("../../etc/passwd"));
  CHECK(!valid_job_id(""));
}

static void segment_names() {
  const std::string job = "0123456789abcdef";
  int64_t pid = 0;
  CHECK(parse_segment_name(segment_name(job, 3), job, 3, &pid) && pid == int64_t(getpid()));
  CHECK(parse_segment_name("fastpar_0123456789abcdef_r1_p42", job, 1, &pid) && pid == 42);
  CHECK(!parse_segment_name("fastpar_0123456789abcdef_r1_p42", job, 2, &pid));        // another rank's
  CHECK(!parse_segment_name("fastpar_fedcba9876543210_r1_p42", job, 1, &pid));        // another job's
  CHECK(!parse_segment_name("fastpar_0123456789abcdef_r1_p", job, 1, &pid));          // no pid
  CHECK(!parse_segment_name("fastpar_0123456789abcdef_r1_p042", job, 1, &pid));       // leading zero
  CHECK(!parse_segment_name("fastpar_0123456789abcdef_r1_p0", job, 1, &pid));
  CHECK(!parse_segment_name("fastpar_0123456789abcdef_r1_p42/../x", job, 1, &pid));
  CHECK(!parse_segment_name("fastpar_0123456789abcdef_r1_p99999999999", job, 1, &pid));
  CHECK(!parse_segment_name("fastpar_0123456789abcdef_r1_p42 ", job, 1, &pid));
  CHECK(!parse_segment_name("victim", job, 1, &pid));
  CHECK(!parse_segment_name("", job, 1, &pid));
  CHECK(!parse_segment_name("fastpar_x_r1_p42", "x", 1, &pid));  // the job id itself must be valid
}

static void quoting() {
  CHECK(printable("abc") == "abc");
  CHECK(printable(std::string("a\nb\0c", 5)) == "a\\x0ab\\x00c");
  CHECK(printable(std::string(100, 'x')) == std::string(80, 'x') + "... (100 bytes)");
  CHECK(printable("back\\slash") == "back\\x5cslash");
}

static void reserve_and_release() {
  const std::string name = "fastpar_test_segment_" + std::to_string(getpid());
  const size_t bytes = size_t(64) << 20;
  {
    Segment s = Segment::create(name, bytes);
    CHECK(unlink_segment(name));  // the mapping keeps the memory
    CHECK(s.fs_total_bytes() > 0 && s.fs_free_bytes() >= 0);
    CHECK(s.reserve(0, 1 << 20) == 0);
    s.data()[(1 << 20) - 1] = 1;  // reserved: touching cannot SIGBUS
    s.release(0, 1 << 20);
    CHECK(s.data()[(1 << 20) - 1] == 0);  // released pages read as zeros
    CHECK(s.reserve(0, 0) == 0);
    // More than the whole file system holds: refused, not SIGBUS later.
    const int64_t total = s.fs_total_bytes();
    Segment big = Segment::create(name + "_big", size_t(total) + (size_t(1) << 30));
    CHECK(unlink_segment(name + "_big"));
    CHECK(big.reserve(0, total + (int64_t(1) << 30)) == ENOSPC);
  }
  struct stat st;
  CHECK(stat(("/dev/shm/" + name).c_str(), &st) != 0);  // unlinked: nothing left
  CHECK(unlink_segment(name));                          // ENOENT is fine
  // A peer's mapping (open) has no descriptor to reserve with.
  Segment own = Segment::create(name, 4096);
  Segment peer = Segment::open(name, 4096);
  CHECK(unlink_segment(name));
  CHECK(peer.reserve(0, 4096) == EBADF);
}

int main() {
  job_ids();
  segment_names();
  quoting();
  reserve_and_release();
  return TEST_MAIN_RESULT();
}
