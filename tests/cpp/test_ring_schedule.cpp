// The ring schedule, executed by the single-process CPU transport with a
// serial parallel-for, against an exact reference: every rank ends with the
// same value, each segment is finished exactly once, and the step structure
// is the textbook one (reduce-scatter then allgather, 2(n-1) steps).
#include <cstdint>
#include <vector>

#include "check.h"
#include "core/executors/cpu_local/cpu_local.h"

using namespace fastpar;

static const cpu_local::ParallelFor serial = [](int64_t b, int64_t e, int64_t,
                                                const std::function<void(int64_t, int64_t)>& f) {
  if (b < e) f(b, e);
};

// Splits into uneven pieces to prove results do not depend on the task split.
static const cpu_local::ParallelFor ragged = [](int64_t b, int64_t e, int64_t,
                                                const std::function<void(int64_t, int64_t)>& f) {
  for (int64_t x = b; x < e;) {
    const int64_t next = std::min(e, x + 1 + (x % 7));
    f(x, next);
    x = next;
  }
};

static void check_structure(int n) {
  CHECK(ring_num_steps(n) == 2 * (n - 1));
  std::vector<int> finished(n, 0);
  for (int step = 0; step < ring_num_steps(n); ++step) {
    std::vector<int> seen(n, 0);
    for (int r = 0; r < n; ++r) {
      const RingStep st = ring_step(n, step, r);
      CHECK(st.dst == r && st.src == (r + n - 1) % n);
      seen[st.segment]++;
      if (st.action == RingAction::kFinish) finished[st.segment]++;
      CHECK((step < n - 1) == (st.action != RingAction::kCopy));
    }
    for (int s = 0; s < n; ++s) CHECK(seen[s] == 1);  // each segment moves once per step
  }
  for (int s = 0; s < n; ++s) CHECK(finished[s] == 1);  // computed once, then copied
}

template <ReduceOp OP>
static void check_values(int n, int64_t count, int64_t seg, const cpu_local::ParallelFor& pf) {
  std::vector<std::vector<int32_t>> data(n, std::vector<int32_t>(static_cast<size_t>(count)));
  std::vector<int32_t> expected(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    for (int r = 0; r < n; ++r) data[r][i] = int32_t((i * 7 + r * 13) % 11) - 5;
    int32_t e = data[0][i];
    for (int r = 1; r < n; ++r) e = combine<OP>(e, data[r][i]);
    expected[i] = e;
  }
  std::vector<int32_t*> ptrs;
  for (auto& d : data) ptrs.push_back(d.data());
  cpu_local::allreduce_ring<int32_t, OP>(pf, ptrs, count, seg, /*align=*/4);
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < count; ++i)
      if (data[r][i] != expected[i]) {
        CHECK(data[r][i] == expected[i]);
        return;
      }
}

int main() {
  for (int n = 1; n <= 8; ++n) {
    if (n > 1) check_structure(n);
    for (int64_t count : {0, 1, 3, 17, 64, 1000, 4099}) {
      for (int64_t seg : {4, 16, 1 << 20}) {
        check_values<ReduceOp::SUM>(n, count, seg, serial);
        check_values<ReduceOp::MAX>(n, count, seg, ragged);
        check_values<ReduceOp::PRODUCT>(n, count, seg, ragged);
      }
    }
  }
  // split_range: parts cover the window exactly, aligned starts, no overlap.
  for (int parts = 1; parts <= 8; ++parts) {
    int64_t next = 10;
    for (int p = 0; p < parts; ++p) {
      const Range r = split_range(10, 1010, parts, p, 16);
      CHECK(r.begin == next);
      CHECK(r.begin == 1010 || (r.begin - 10) % 16 == 0);
      next = r.end;
    }
    CHECK(next == 1010);
  }
  return TEST_MAIN_RESULT();
}
