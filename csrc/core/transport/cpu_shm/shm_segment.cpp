#include "shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "syscheck.h"

namespace fastpar {
namespace cpu_shm {

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    if (base_) munmap(base_, bytes_);
    name_ = std::move(o.name_);
    base_ = o.base_;
    bytes_ = o.bytes_;
    o.base_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

Segment::~Segment() {
  if (base_) munmap(base_, bytes_);
}

static char* map_fd(int fd, size_t bytes, const std::string& name) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    close(fd);
    throw std::runtime_error(syscall_error("mmap of shared memory segment /" + name, err));
  }
  close(fd);  // the mapping keeps the memory; the descriptor is not needed
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
    s.base_ = map_fd(fd, bytes, name);
  } catch (...) {
    shm_unlink(path.c_str());
    throw;
  }
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
  s.base_ = map_fd(fd, bytes, name);
  s.name_ = name;
  s.bytes_ = bytes;
  return s;
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

}  // namespace cpu_shm
}  // namespace fastpar
