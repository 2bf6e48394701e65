// The cpu_shm segment (csrc/core/transport/cpu_shm/shm_segment.*): which
// names from the store are accepted (only this job's name of the expected
// rank, with a plausible creator: anything else is never opened or unlinked),
// which creators count as gone, what the sweep of dead creators' leftovers removes,
// how values are quoted in messages, and reserving / releasing memory of a
// segment (fallocate), including a reservation larger than /dev/shm.
#include <sys/stat.h>
#include <sys/wait.h>
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
  const ProcessId self = this_process();
  CHECK(self.pid == int64_t(getpid()) && self.start > 0 && self.pidns > 0);
  ProcessId id;
  CHECK(parse_segment_name(segment_name(job, 3, self), job, 3, &id) && id.pid == self.pid && id.start == self.start &&
        id.pidns == self.pidns);
  CHECK(parse_segment_name("fastpar_0123456789abcdef_r1_p42_t7_n9", job, 1, &id) && id.pid == 42 && id.start == 7 &&
        id.pidns == 9);
  CHECK(!parse_segment_name("fastpar_0123456789abcdef_r1_p42_t7_n9", job, 2, &id));   // another rank's
  CHECK(!parse_segment_name("fastpar_fedcba9876543210_r1_p42_t7_n9", job, 1, &id));   // another job's
  CHECK(!parse_segment_name("fastpar_0123456789abcdef_r1_p42", job, 1, &id));         // no start time
  CHECK(!parse_segment_name("fastpar_0123456789abcdef_r1_p_t7_n9", job, 1, &id));     // no pid
  CHECK(!parse_segment_name("fastpar_0123456789abcdef_r1_p042_t7_n9", job, 1, &id));  // leading zero
  CHECK(!parse_segment_name("fastpar_0123456789abcdef_r1_p42_t07_n9", job, 1, &id));
  CHECK(!parse_segment_name("fastpar_0123456789abcdef_r1_p0_t7_n9", job, 1, &id));
  CHECK(!parse_segment_name("fastpar_0123456789abcdef_r1_p42_t7_n9/../x", job, 1, &id));
  CHECK(!parse_segment_name("fastpar_0123456789abcdef_r1_p99999999999_t7_n9", job, 1, &id));
  CHECK(!parse_segment_name("fastpar_0123456789abcdef_r1_p42_t7_n9 ", job, 1, &id));
  CHECK(!parse_segment_name("victim", job, 1, &id));
  CHECK(!parse_segment_name("", job, 1, &id));
  CHECK(!parse_segment_name("fastpar_x_r1_p42_t7_n9", "x", 1, &id));  // the job id itself must be valid
  CHECK(parse_any_segment_name("fastpar_0123456789abcdef_r12_p42_t7_n9", &id) && id.pid == 42);
  CHECK(!parse_any_segment_name("fastpar_0123456789abcdef_r012_p42_t7_n9", &id));
  CHECK(!parse_any_segment_name("fastpar_test_segment_42", &id));
  CHECK(!parse_any_segment_name("fastpar_0123456789abcdef_r1_p42", &id));  // the old form: the pid could be reused
  CHECK(parse_process(format_process(self), &id) && id.pid == self.pid);
  CHECK(!parse_process("42_t7", &id));
}

// Only a provably gone process counts as gone: this one, one of another pid
// namespace, one with a start time unknown are alive; a reaped child, and a
// live pid with another start time (the pid reused), are gone.
static void liveness_of_creators() {
  const ProcessId self = this_process();
  CHECK(!process_gone(self));
  CHECK(!process_gone(ProcessId{self.pid, self.start, self.pidns + 1}));
  CHECK(!process_gone(ProcessId{self.pid, 0, self.pidns}));
  CHECK(process_gone(ProcessId{self.pid, self.start + 1, self.pidns}));
  const pid_t child = fork();
  if (child == 0) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  CHECK(process_gone(ProcessId{child, 1, self.pidns}));
}

// The sweep unlinks this user's segment of a dead creator and nothing else:
// a live creator's, a name of another form.
static void sweep() {
  const ProcessId self = this_process();
  const pid_t child = fork();
  if (child == 0) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  const std::string job = random_job_id();
  const std::string dead = segment_name(job, 0, ProcessId{child, self.start, self.pidns});
  const std::string live = segment_name(job, 1, self);
  const std::string other = "fastpar_test_sweep_" + std::to_string(getpid());
  for (const auto& n : {dead, live, other}) {
    Segment s = Segment::create(n, 4096);
  }
  sweep_dead_segments();
  struct stat st;
  CHECK(stat(("/dev/shm/" + dead).c_str(), &st) != 0);
  CHECK(stat(("/dev/shm/" + live).c_str(), &st) == 0);
  CHECK(stat(("/dev/shm/" + other).c_str(), &st) == 0);
  CHECK(unlink_segment(live) && unlink_segment(other));
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
  liveness_of_creators();
  sweep();
  quoting();
  reserve_and_release();
  return TEST_MAIN_RESULT();
}
