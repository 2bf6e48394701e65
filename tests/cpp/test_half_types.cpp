// The 16-bit conversions the CPU loops and CUDA kernels share, checked
// exhaustively against the compiler's own IEEE types (_Float16, and bf16 by
// its definition: the upper half of a float, rounded to nearest even).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "check.h"
#include "core/kernels/half_types.h"

using namespace fastpar;

static uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

static float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

int main() {
  // Every half value converts to float exactly, and back to the same bits.
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = to_float(f16{uint16_t(h)});
#if defined(__FLT16_MAX__)
    _Float16 ref;
    const uint16_t hb = uint16_t(h);
    std::memcpy(&ref, &hb, 2);
    CHECK(std::isnan(f) == std::isnan(float(ref)));
    if (!std::isnan(f)) CHECK(bits_of(f) == bits_of(float(ref)));
#endif
    if (!std::isnan(f)) CHECK(to_f16(f).bits == h);
    const float b = to_float(bf16{uint16_t(h)});
    CHECK(bits_of(b) == (h << 16));
    if (!std::isnan(b)) CHECK(to_bf16(b).bits == h);
  }
#if defined(__FLT16_MAX__)
  // float -> half rounding on a dense sweep of float bit patterns (every 97th),
  // covering subnormals, ties, overflow to inf and NaN.
  for (uint64_t u = 0; u <= 0xffffffffull; u += 97) {
    const float f = float_of(uint32_t(u));
    const _Float16 ref = static_cast<_Float16>(f);
    uint16_t rb;
    std::memcpy(&rb, &ref, 2);
    const uint16_t got = to_f16(f).bits;
    if (std::isnan(f)) {
      CHECK((got & 0x7c00) == 0x7c00 && (got & 0x3ff) != 0);
    } else if (got != rb) {
      CHECK(got == rb);
      break;  // one report is enough
    }
  }
#endif
  // bf16: round to nearest even at the tie, and NaN stays NaN.
  CHECK(to_bf16(float_of(0x3f808000u)).bits == 0x3f80);  // tie, even stays
  CHECK(to_bf16(float_of(0x3f818000u)).bits == 0x3f82);  // tie, odd rounds up
  CHECK(to_bf16(float_of(0x3f808001u)).bits == 0x3f81);  // above the tie
  CHECK(std::isnan(to_float(to_bf16(std::nanf("")))));
  CHECK(to_f16(65520.0f).bits == 0x7c00);  // rounds to +inf
  CHECK(to_f16(65504.0f).bits == 0x7bff);  // largest finite
  CHECK(to_f16(-0.0f).bits == 0x8000);
  return TEST_MAIN_RESULT();
}
