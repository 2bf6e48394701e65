#include "shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>

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

std::string segment_name(const std::string& job_id, int rank) {
  return std::string(kSegmentPrefix) + job_id + "_r" + std::to_string(rank) + "_p" +
         std::to_string(getpid());
}

bool valid_job_id(const std::string& job_id) {
  if (job_id.size() != 16) return false;
  for (char ch : job_id)
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) return false;
  return true;
}

bool parse_segment_name(const std::string& name, const std::string& job_id, int rank, int64_t* pid) {
  const std::string head = std::string(kSegmentPrefix) + job_id + "_r" + std::to_string(rank) + "_p";
  if (!valid_job_id(job_id) || name.size() <= head.size() || name.compare(0, head.size(), head) != 0) return false;
  const std::string digits = name.substr(head.size());
  if (digits.size() > 10 || digits[0] == '0') return false;  // a pid: 1 .. 4194304, no leading zero
  int64_t v = 0;
  for (char ch : digits) {
    if (ch < '0' || ch > '9') return false;
    v = v * 10 + (ch - '0');
  }
  if (v <= 0 || v > INT32_MAX) return false;
  *pid = v;
  return true;
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
