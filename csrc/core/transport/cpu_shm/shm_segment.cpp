#include "shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <stdexcept>
#include <vector>

#include "../liveness/process_liveness.h"
#include "syscheck.h"

namespace fastpar {
namespace cpu_shm {

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    if (base_) munmap(base_, bytes_);
    if (fd_ >= 0) close(fd_);
    name_ = std::move(o.name_);
    base_ = o.base_;
    bytes_ = o.bytes_;
    fd_ = o.fd_;
    o.base_ = nullptr;
    o.bytes_ = 0;
    o.fd_ = -1;
  }
  return *this;
}

Segment::~Segment() {
  if (base_) munmap(base_, bytes_);
  if (fd_ >= 0) close(fd_);
}

// Maps `fd`; closes it unless `keep` (the owner keeps its descriptor for
// reserve / release; a peer's mapping keeps the memory without one).
static char* map_fd(int fd, size_t bytes, const std::string& name, bool keep) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    close(fd);
    throw std::runtime_error(syscall_error("mmap of shared memory segment /" + name, err));
  }
  if (!keep) close(fd);
  return static_cast<char*>(p);
}

Segment Segment::create(const std::string& name, size_t bytes) {
  const std::string path = "/" + name;
  const int fd = FASTPAR_SYSCHECK(shm_open(path.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600),
                                  "shm_open(O_CREAT) of " + path);
  if (ftruncate_retry(fd, off_t(bytes)) != 0) {
    const int err = errno;
    close(fd);
    shm_unlink(path.c_str());
    throw std::runtime_error(syscall_error("ftruncate of " + path + " to " + std::to_string(bytes) + " bytes", err));
  }
  Segment s;
  try {
    s.base_ = map_fd(fd, bytes, name, true);
  } catch (...) {
    shm_unlink(path.c_str());
    throw;
  }
  s.fd_ = fd;
  s.name_ = name;
  s.bytes_ = bytes;
  return s;
}

Segment Segment::open(const std::string& name, size_t bytes) {
  const std::string path = "/" + name;
  const int fd = FASTPAR_SYSCHECK(shm_open(path.c_str(), O_RDWR, 0600), "shm_open of peer segment " + path);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    throw std::runtime_error(syscall_error("fstat of " + path, err));
  }
  if (size_t(st.st_size) != bytes) {
    close(fd);
    throw std::runtime_error("fastpar: peer segment " + path + " has " + std::to_string(st.st_size) +
                             " bytes but " + std::to_string(bytes) +
                             " were expected (ranks disagree on FASTPAR_SHM_SLOT_BYTES or "
                             "FASTPAR_SHM_REGISTERED_BYTES?)");
  }
  Segment s;
  s.base_ = map_fd(fd, bytes, name, false);
  s.name_ = name;
  s.bytes_ = bytes;
  return s;
}

int Segment::reserve(int64_t offset, int64_t bytes) const {
  if (bytes <= 0) return 0;
  if (fd_ < 0) return EBADF;
  int r;
  do {
    r = posix_fallocate(fd_, off_t(offset), off_t(bytes));  // returns the error, errno untouched
  } while (r == EINTR);
  return r;
}

void Segment::release(int64_t offset, int64_t bytes) const {
  const int64_t page = 4096;
  const int64_t begin = (offset + page - 1) / page * page, end = (offset + bytes) / page * page;
  if (fd_ < 0 || end <= begin) return;
  // Pages only: a partial page may hold a neighbour's block. Failure (an old
  // kernel) just keeps the memory until the segment goes.
  (void)fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(begin), off_t(end - begin));
}

int64_t Segment::fs_free_bytes() const {
  struct statvfs v;
  if (fd_ < 0 || fstatvfs(fd_, &v) != 0) return -1;
  return int64_t(v.f_bavail) * int64_t(v.f_frsize);
}

int64_t Segment::fs_total_bytes() const {
  struct statvfs v;
  if (fd_ < 0 || fstatvfs(fd_, &v) != 0) return -1;
  return int64_t(v.f_blocks) * int64_t(v.f_frsize);
}

bool unlink_segment(const std::string& name) {
  const std::string path = "/" + name;
  int r;
  do {
    r = shm_unlink(path.c_str());
  } while (r != 0 && errno == EINTR);
  return r == 0 || errno == ENOENT;
}

std::string random_job_id() {
  unsigned char b[8] = {0};
  const int fd = FASTPAR_SYSCHECK(::open("/dev/urandom", O_RDONLY | O_CLOEXEC), "open /dev/urandom");
  size_t got = 0;
  while (got < sizeof(b)) {
    const ssize_t r = read(fd, b + got, sizeof(b) - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int err = errno;
      close(fd);
      throw std::runtime_error(syscall_error("read /dev/urandom", err));
    }
    got += size_t(r);
  }
  close(fd);
  char hex[17];
  for (int i = 0; i < 8; ++i) std::snprintf(hex + 2 * i, 3, "%02x", b[i]);
  return std::string(hex, 16);
}

namespace {

// The text of /proc/<pid>/stat ("self" for this process), "" if unreadable.
std::string read_stat(const std::string& pid) {
  const std::string path = "/proc/" + pid + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  char buf[1024];
  std::string out;
  for (;;) {
    const ssize_t r = read(fd, buf, sizeof(buf));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    out.append(buf, size_t(r));
  }
  close(fd);
  return out;
}

// Field 22 (starttime) of a stat text; 0 if absent. The command name (field
// 2) may hold spaces and ')', hence the last ')'.
uint64_t start_time(const std::string& stat) {
  const size_t p = stat.rfind(')');
  if (p == std::string::npos) return 0;
  const char* c = stat.c_str() + p + 1;
  for (int field = 3; field < 22; ++field) {
    while (*c == ' ') ++c;
    while (*c != ' ' && *c != '\0') ++c;
  }
  char* end = nullptr;
  const unsigned long long v = std::strtoull(c, &end, 10);
  return end == c ? 0 : uint64_t(v);
}

uint64_t own_pidns() {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? uint64_t(st.st_ino) : 0;
}

// Decimal digits without a leading zero (or "0" when `zero_ok`) at s[i..],
// up to the first char not a digit; advances i. False on overflow or none.
bool parse_decimal(const std::string& s, size_t* i, uint64_t* v, bool zero_ok) {
  const size_t begin = *i;
  uint64_t x = 0;
  while (*i < s.size() && s[*i] >= '0' && s[*i] <= '9') {
    if (*i - begin >= 19) return false;
    x = x * 10 + uint64_t(s[*i] - '0');
    ++*i;
  }
  const size_t n = *i - begin;
  if (n == 0 || (n > 1 && s[begin] == '0') || (x == 0 && !zero_ok)) return false;
  *v = x;
  return true;
}

bool expect(const std::string& s, size_t* i, const char* lit) {
  const size_t n = std::strlen(lit);
  if (s.compare(*i, n, lit) != 0) return false;
  *i += n;
  return true;
}

// The ProcessId at s[i..] to the end ("<pid>_t<start>_n<pidns>").
bool parse_process_at(const std::string& s, size_t i, ProcessId* id) {
  uint64_t pid = 0, start = 0, ns = 0;
  if (!parse_decimal(s, &i, &pid, false) || pid > uint64_t(INT32_MAX)) return false;
  if (!expect(s, &i, "_t") || !parse_decimal(s, &i, &start, true)) return false;
  if (!expect(s, &i, "_n") || !parse_decimal(s, &i, &ns, true) || i != s.size()) return false;
  *id = ProcessId{int64_t(pid), start, ns};
  return true;
}

}  // namespace

ProcessId this_process() {
  return ProcessId{int64_t(getpid()), start_time(read_stat("self")), own_pidns()};
}

std::string format_process(const ProcessId& id) {
  return std::to_string(id.pid) + "_t" + std::to_string(id.start) + "_n" + std::to_string(id.pidns);
}

bool parse_process(const std::string& text, ProcessId* id) { return parse_process_at(text, 0, id); }

bool process_gone(const ProcessId& id) {
  if (id.pid <= 0 || id.start == 0 || id.pidns == 0 || id.pidns != own_pidns()) return false;
  const std::string stat = read_stat(std::to_string(id.pid));
  if (stat.empty()) return kill(pid_t(id.pid), 0) != 0 && errno == ESRCH;  // EPERM: it exists
  const uint64_t start = start_time(stat);
  if (start == 0) return false;
  if (start != id.start) return true;  // the pid now names another process
  return !liveness::stat_says_alive(stat);
}

std::string segment_name(const std::string& job_id, int rank, const ProcessId& creator) {
  return std::string(kSegmentPrefix) + job_id + "_r" + std::to_string(rank) + "_p" + format_process(creator);
}

bool valid_job_id(const std::string& job_id) {
  if (job_id.size() != 16) return false;
  for (char ch : job_id)
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) return false;
  return true;
}

bool parse_segment_name(const std::string& name, const std::string& job_id, int rank, ProcessId* creator) {
  const std::string head = std::string(kSegmentPrefix) + job_id + "_r" + std::to_string(rank) + "_p";
  if (!valid_job_id(job_id) || name.size() <= head.size() || name.compare(0, head.size(), head) != 0) return false;
  return parse_process_at(name, head.size(), creator);
}

bool parse_any_segment_name(const std::string& name, ProcessId* creator) {
  const size_t prefix = std::strlen(kSegmentPrefix);
  if (name.compare(0, prefix, kSegmentPrefix) != 0 || name.size() < prefix + 16) return false;
  const std::string job = name.substr(prefix, 16);
  size_t i = prefix + 16;
  uint64_t rank = 0;
  if (!valid_job_id(job) || !expect(name, &i, "_r") || !parse_decimal(name, &i, &rank, true) ||
      rank > uint64_t(INT32_MAX))
    return false;
  return parse_segment_name(name, job, int(rank), creator);
}

int sweep_dead_segments() {
  DIR* d = opendir("/dev/shm");
  if (!d) return 0;
  std::vector<std::string> dead;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    ProcessId id;
    if (!parse_any_segment_name(name, &id)) continue;
    struct stat st;
    if (fstatat(dirfd(d), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
        st.st_uid != geteuid())
      continue;
    if (process_gone(id)) dead.push_back(name);
  }
  closedir(d);
  int n = 0;
  for (const auto& name : dead) n += shm_unlink(("/" + name).c_str()) == 0 ? 1 : 0;
  return n;
}

std::string printable(const std::string& value, size_t max) {
  std::string out;
  for (size_t i = 0; i < value.size() && i < max; ++i) {
    const unsigned char ch = static_cast<unsigned char>(value[i]);
    if (ch >= 0x20 && ch < 0x7f && ch != '\\') {
      out += char(ch);
    } else {
      char hex[5];
      std::snprintf(hex, sizeof(hex), "\\x%02x", ch);
      out += hex;
    }
  }
  if (value.size() > max) out += "... (" + std::to_string(value.size()) + " bytes)";
  return out;
}

}  // namespace cpu_shm
}  // namespace fastpar
