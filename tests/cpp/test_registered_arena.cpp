// The registered-buffer bookkeeping (csrc/core/transport/registered_arena.h):
// first fit in 256-byte blocks, the same offsets for the same sequence of
// calls (what lets ranks agree without talking), merging of freed
// neighbours, and which pointers lie inside the region.
#include <cstdint>
#include <vector>

#include "check.h"
#include "core/transport/registered_arena.h"

using fastpar::RegisteredArena;

static void first_fit_and_merge() {
  RegisteredArena a(4096);
  CHECK(a.bytes() == 4096);
  const int64_t x = a.alloc(1), y = a.alloc(300), z = a.alloc(256);
  CHECK(x == 0 && y == 256 && z == 768);  // 1 -> one block, 300 -> two
  CHECK(a.live() == 3);
  a.free(y);
  CHECK(a.alloc(256) == 256);   // the first hole that fits
  CHECK(a.alloc(512) == 1024);  // the rest of y's hole is too small
  a.free(256);
  a.free(x);
  CHECK(a.alloc(512) == 0);     // x's block and the freed one merged
  a.free(12345);                // not allocated: ignored
  CHECK(a.alloc(4096) == -1);   // no room for the whole region now
  CHECK(a.alloc(-5) >= 0);      // a negative size still takes one block
}

static void same_calls_same_offsets() {
  RegisteredArena a(1 << 16), b(1 << 16);
  std::vector<int64_t> sizes = {100, 4000, 17, 256, 9000};
  for (int64_t s : sizes) CHECK(a.alloc(s) == b.alloc(s));
  a.free(256);
  b.free(256);
  CHECK(a.alloc(64) == b.alloc(64));
}

static void offsets_of_pointers() {
  std::vector<char> region(1024);
  RegisteredArena a(1024);
  const char* base = region.data();
  CHECK(a.offset_of(base, 1024, base) == 0);
  CHECK(a.offset_of(base + 100, 24, base) == 100);
  CHECK(a.offset_of(base + 1000, 25, base) == -1);  // runs past the end
  CHECK(a.offset_of(base - 1, 1, base) == -1);
  CHECK(a.offset_of(base, 1, nullptr) == -1);
  RegisteredArena none(0);
  CHECK(none.alloc(1) == -1);
  CHECK(none.offset_of(base, 1, base) == -1);
}

int main() {
  first_fit_and_merge();
  same_calls_same_offsets();
  offsets_of_pointers();
  return TEST_MAIN_RESULT();
}
