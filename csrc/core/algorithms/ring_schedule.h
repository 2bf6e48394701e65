// Ring allreduce as a schedule: which rank does what to which segment at each
// step. No pointers, no memory, no threads or streams: transports execute it.
//
// The buffer is cut into windows of n segments (a window is the pipelining
// unit: memory for accumulators stays at one window per rank). Inside a window,
// with n ranks and steps s = 0 .. 2(n-1)-1:
//
//   reduce-scatter, s = 0 .. n-2: rank r receives segment (r-1-s) mod n from rank r-1
//     and folds its own copy in. At s = n-2 the fold is the last one: rank r then
//     holds the final value of segment (r+1) mod n and writes it into its data.
//   allgather, s = n-1 .. 2n-3 (t = s-(n-1)): rank r copies segment (r-t) mod n,
//     final by now, from rank r-1's data into its own.
//
// Each segment's final value is computed exactly once, then copied, which is why
// every rank ends with identical bits. Partial sums travel in the accumulator
// type (fp32 for 16-bit floats) through per-rank accumulator buffers.
#pragma once

#include <algorithm>
#include <cstdint>

namespace fastpar {

enum class RingAction {
  kFoldFirst,  // acc[dst][seg]  = data[src][seg] (+) data[dst][seg]
  kFold,       // acc[dst][seg]  = acc[src][seg]  (+) data[dst][seg]
  kFinish,     // data[dst][seg] = finalize((acc or data)[src][seg] (+) data[dst][seg])
  kCopy,       // data[dst][seg] = data[src][seg]
};

struct RingStep {
  RingAction action;
  int src;           // the rank read from (always dst - 1 mod n)
  int dst;           // the rank that executes the step and is written
  int segment;       // 0 .. n-1 within the window
  bool src_is_data;  // for kFinish: the source partial is still in T (n == 2)
};

inline int ring_num_steps(int n) { return n <= 1 ? 0 : 2 * (n - 1); }

inline int ring_mod(int a, int n) { return ((a % n) + n) % n; }

inline RingStep ring_step(int n, int step, int dst) {
  const int src = ring_mod(dst - 1, n);
  if (step < n - 1) {
    const int seg = ring_mod(dst - 1 - step, n);
    if (step == n - 2) return {RingAction::kFinish, src, dst, seg, /*src_is_data=*/step == 0};
    return {step == 0 ? RingAction::kFoldFirst : RingAction::kFold, src, dst, seg, false};
  }
  const int t = step - (n - 1);
  return {RingAction::kCopy, src, dst, ring_mod(dst - t, n), false};
}

// Element range [begin, end) of segment j of a window [wbegin, wend): equal
// parts rounded up to `align` elements (the vector width), the last ones shorter
// or empty.
struct Range {
  int64_t begin;
  int64_t end;
  int64_t size() const { return end - begin; }
};

inline Range split_range(int64_t wbegin, int64_t wend, int parts, int part, int64_t align) {
  const int64_t total = wend - wbegin;
  int64_t per = (total + parts - 1) / parts;
  per = (per + align - 1) / align * align;
  const int64_t b = std::min(wend, wbegin + per * part);
  const int64_t e = std::min(wend, b + per);
  return {b, e};
}

// Number of windows for `count` elements with `window` elements per window.
inline int64_t num_windows(int64_t count, int64_t window) {
  return count == 0 ? 0 : (count + window - 1) / window;
}

}  // namespace fastpar
