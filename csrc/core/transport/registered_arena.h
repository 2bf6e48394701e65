// The bookkeeping of registered buffers (registered_empty): a region of this
// rank's shared memory (a cpu_shm segment, a CUDA IPC arena) that every peer
// maps, handed out first-fit in 256-byte blocks. Purely local: ranks that
// allocate and free in the same order get the same offsets, and the schedules'
// agreement phase (allreduce_slots.h, agree_registered) checks that they do.
// Thread-safe: the deleters of registered tensors may run on any thread.
// Torch-free and CUDA-free (ctest: test_registered_arena).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>

namespace fastpar {

class RegisteredArena {
 public:
  explicit RegisteredArena(int64_t bytes) : bytes_(std::max<int64_t>(0, bytes)) {
    if (bytes_ > 0) free_[0] = bytes_;
  }

  int64_t bytes() const { return bytes_; }

  // The offset of a new block of at least `bytes` (>= 0), or -1 if none fits.
  int64_t alloc(int64_t bytes) {
    std::lock_guard<std::mutex> g(mu_);
    const int64_t need = block_bytes(bytes);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < need) continue;
      const int64_t off = it->first, len = it->second;
      free_.erase(it);
      if (len > need) free_[off + need] = len - need;
      used_[off] = need;
      return off;
    }
    return -1;
  }

  // A free range: [offset, offset + bytes).
  struct Range {
    int64_t offset;
    int64_t bytes;
  };

  // Returns the block at `offset` (from alloc) and merges it with free
  // neighbours; returns the merged free range it now lies in (whose memory a
  // transport may give back), or {-1, 0} for an offset that is not
  // allocated, which is ignored.
  Range free(int64_t offset) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = used_.find(offset);
    if (it == used_.end()) return Range{-1, 0};
    int64_t off = it->first, len = it->second;
    used_.erase(it);
    auto next = free_.lower_bound(off);
    if (next != free_.end() && next->first == off + len) {
      len += next->second;
      free_.erase(next);
    }
    auto prev = free_.lower_bound(off);
    if (prev != free_.begin()) {
      --prev;
      if (prev->first + prev->second == off) {
        off = prev->first;
        len += prev->second;
        free_.erase(prev);
      }
    }
    free_[off] = len;
    return Range{off, len};
  }

  // Bytes of the block alloc hands out for a request of `bytes`.
  static int64_t block_bytes(int64_t bytes) {
    return std::max<int64_t>(kBlock, (bytes + kBlock - 1) / kBlock * kBlock);
  }

  // Offset of [p, p + bytes) in the region starting at `base`, or -1 when it
  // is not inside.
  int64_t offset_of(const void* p, int64_t bytes, const void* base) const {
    const char* c = static_cast<const char*>(p);
    const char* a = static_cast<const char*>(base);
    if (bytes_ == 0 || base == nullptr || c < a || c + bytes > a + bytes_) return -1;
    return int64_t(c - a);
  }

  // Blocks handed out and not freed yet.
  int64_t live() const {
    std::lock_guard<std::mutex> g(mu_);
    return int64_t(used_.size());
  }

 private:
  static constexpr int64_t kBlock = 256;  // keeps every buffer 256-byte aligned
  const int64_t bytes_;
  mutable std::mutex mu_;
  std::map<int64_t, int64_t> free_;  // offset -> bytes
  std::map<int64_t, int64_t> used_;
};

}  // namespace fastpar
