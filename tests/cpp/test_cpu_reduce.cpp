// The CPU reduce loop: fixed order, in-place aliasing, fp32 accumulation for
// 16-bit floats, AVG as a division (on integers NCCL's: the wrapped sum
// divided by n, truncated toward zero), non-temporal stores on aligned and
// misaligned destinations; stream_copy at every alignment.
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <type_traits>
#include <vector>

#include "check.h"
#include "core/kernels/cpu_reduce.h"

using namespace fastpar;

int main() {
  // stream_copy: the bytes of memcpy for every head / tail split, and nothing
  // written outside [dst, dst + bytes).
  for (int64_t dst_off = 0; dst_off < 16; ++dst_off)
    for (int64_t src_off : {0, 3, 8})
      for (int64_t bytes : {0, 1, 15, 16, 17, 31, 64, 100, 4096 + 7}) {
        std::vector<unsigned char> src(size_t(bytes + 32));
        for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 1);
        alignas(64) static unsigned char aligned[4096 + 128];
        unsigned char* d = aligned + dst_off;
        std::memset(aligned, 0xAB, sizeof(aligned));
        stream_copy(d, src.data() + src_off, bytes);
        CHECK(std::memcmp(d, src.data() + src_off, size_t(bytes)) == 0);
        CHECK(dst_off == 0 || aligned[dst_off - 1] == 0xAB);
        CHECK(d[bytes] == 0xAB);
      }
  // In place, 3 sources, every block/tail length around kCpuBlock, both store paths.
  for (bool streaming : {false, true}) {
    for (int64_t count : {int64_t(0), int64_t(1), kCpuBlock - 1, kCpuBlock, kCpuBlock + 1, 3 * kCpuBlock + 5}) {
      for (int64_t offset : {0, 1}) {  // offset 1: misaligned destinations fall back to plain stores
        std::vector<std::vector<float>> buf(3, std::vector<float>(static_cast<size_t>(count + 1)));
        std::vector<const float*> srcs;
        std::vector<float*> dsts;
        for (int s = 0; s < 3; ++s) {
          for (int64_t i = 0; i < count; ++i) buf[s][i + offset] = float(i % 5 + s);
          srcs.push_back(buf[s].data() + offset);
          dsts.push_back(buf[s].data() + offset);
        }
        cpu_reduce_range<float, ReduceOp::AVG>(srcs.data(), 3, dsts.data(), 3, 0, count, 3, streaming);
        for (int s = 0; s < 3; ++s)
          for (int64_t i = 0; i < count; ++i) CHECK(buf[s][i + offset] == float(3 * (i % 5) + 3) / 3.0f);
      }
    }
  }
  // fp16: 2048 + 1 + 1 is 2050 with fp32 accumulation (2049 is not a half).
  {
    std::vector<f16> a(5, to_f16(2048.f)), b(5, to_f16(1.f)), c(5, to_f16(1.f)), out(5);
    const f16* srcs[] = {a.data(), b.data(), c.data()};
    f16* dsts[] = {out.data()};
    cpu_reduce_range<f16, ReduceOp::SUM>(srcs, 3, dsts, 1, 0, 5, 3);
    CHECK(to_float(out[4]) == 2050.f);
  }
  // MIN/MAX propagate NaN from any position, as torch.minimum/maximum do.
  {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    float x[] = {1.f, nan, 3.f}, y[] = {nan, 2.f, 0.f}, out[3];
    const float* srcs[] = {x, y};
    float* dsts[] = {out};
    cpu_reduce_range<float, ReduceOp::MAX>(srcs, 2, dsts, 1, 0, 3, 2);
    CHECK(out[0] != out[0] && out[1] != out[1] && out[2] == 3.f);
    cpu_reduce_range<float, ReduceOp::MIN>(srcs, 2, dsts, 1, 0, 3, 2);
    CHECK(out[0] != out[0] && out[1] != out[1] && out[2] == 0.f);
  }
  // Integers wrap like NCCL's: int8 127 + 1 == -128.
  {
    int8_t a[] = {127}, b[] = {1}, out[1];
    const int8_t* srcs[] = {a, b};
    int8_t* dsts[] = {out};
    cpu_reduce_range<int8_t, ReduceOp::SUM>(srcs, 2, dsts, 1, 0, 1, 2);
    CHECK(out[0] == -128);
  }
  // Integer AVG as NCCL's ncclAvg (SumPostDiv): wrap the sum in the dtype,
  // then divide by the number of contributions, truncating toward zero.
  {
    // int8: 100 * 3 wraps to 44; 44 / 3 == 14. -7 + 2 == -5; -5 / 2 == -2 (not floor's -3).
    int8_t a[] = {100, -7}, b[] = {100, 2}, c[] = {100, 0}, out[2];
    const int8_t* srcs[] = {a, b, c};
    int8_t* dsts[] = {out};
    cpu_reduce_range<int8_t, ReduceOp::AVG>(srcs, 3, dsts, 1, 0, 2, 3);
    CHECK(out[0] == 14);
    cpu_reduce_range<int8_t, ReduceOp::AVG>(srcs, 2, dsts, 1, 1, 2, 2);
    CHECK(out[1] == -2);
  }
  {
    // uint8: 200 + 100 wraps to 44, / 2 == 22; 257 contributions (more than
    // uint8 holds) divide 255 to 0 instead of dividing by 257 wrapped to 1.
    uint8_t a[] = {200, 255}, b[] = {100, 0}, out[2];
    const uint8_t* srcs[] = {a, b};
    uint8_t* dsts[] = {out};
    cpu_reduce_range<uint8_t, ReduceOp::AVG>(srcs, 2, dsts, 1, 0, 1, 2);
    CHECK(out[0] == 22);
    cpu_reduce_range<uint8_t, ReduceOp::AVG>(srcs, 1, dsts, 1, 1, 2, 257);
    CHECK(out[1] == 0);
  }
  {
    // int32 / int64: the sum wraps past the maximum to the minimum, then halves toward zero.
    const int32_t i32max = std::numeric_limits<int32_t>::max();
    int32_t a[] = {i32max, -3}, b[] = {1, 0}, out[2];
    const int32_t* srcs[] = {a, b};
    int32_t* dsts[] = {out};
    cpu_reduce_range<int32_t, ReduceOp::AVG>(srcs, 2, dsts, 1, 0, 2, 2);
    CHECK(out[0] == -1073741824 && out[1] == -1);
    const int64_t i64min = std::numeric_limits<int64_t>::min();
    int64_t x[] = {i64min, i64min}, y[] = {-1, 0}, out64[2];
    const int64_t* srcs64[] = {x, y};
    int64_t* dsts64[] = {out64};
    cpu_reduce_range<int64_t, ReduceOp::AVG>(srcs64, 2, dsts64, 1, 0, 2, 2);
    CHECK(out64[0] == std::numeric_limits<int64_t>::max() / 2 && out64[1] == i64min / 2);
  }
  // The integer AVG's divisions are C++'s truncating one. 64-bit
  // (div_by_count, in 32-bit divisions): both digit paths (divisors below
  // 2^16 and above), signs, the extremes, and an LCG's spread of dividends.
  {
    const int64_t i64min = std::numeric_limits<int64_t>::min(), i64max = std::numeric_limits<int64_t>::max();
    const int divisors[] = {1, 2, 3, 7, 8, 255, 65535, 65536, 65537, 1 << 20, 123456789, std::numeric_limits<int>::max()};
    std::vector<int64_t> xs = {0, 1, -1, 2, -7, i64max, i64min, i64min + 1, int64_t(1) << 32, -(int64_t(1) << 32) - 1,
                               (int64_t(1) << 48) - 1};
    uint64_t lcg = 1;
    for (int i = 0; i < 2000; ++i) {
      lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
      xs.push_back(int64_t(lcg) >> (i % 61));
    }
    int mismatches = 0;
    for (int64_t x : xs)
      for (int d : divisors) mismatches += div_by_count(x, d) != x / d;
    CHECK(mismatches == 0);
    // The 8-bit AVG's (div8_by_count, a multiply): every dividend an int8 or
    // uint8 sum can be, every divisor up to 2^17 (past 2^16 the multiplier
    // is 1), and far past it.
    mismatches = 0;
    for (int x = -128; x <= 255; ++x) {
      for (int d = 1; d <= (1 << 17); ++d) mismatches += div8_by_count(x, d) != x / d;
      for (int d : {(1 << 24) - 1, 1 << 24, (1 << 24) + 1, std::numeric_limits<int>::max()})
        mismatches += div8_by_count(x, d) != x / d;
    }
    CHECK(mismatches == 0);
  }
  // Four 1-byte elements combined in one word (combine_bytes, the one-kernel
  // collectives' int8 / uint8 packs): every pair of bytes, in every byte of
  // the word, against combine<OP> on each byte, beside neighbours that would
  // show a carry or a borrow crossing bytes.
  {
    int mismatches = 0;
    auto check_op = [&](auto op_tag, auto type_tag) {
      constexpr ReduceOp OP = decltype(op_tag)::value;
      using T = decltype(type_tag);
      for (int a = 0; a < 256; ++a)
        for (int b = 0; b < 256; ++b)
          for (int k = 0; k < 4; ++k) {
            const uint32_t na = 0xff00ff80u, nb = 0x80ff01ffu;  // the other bytes
            const uint32_t wa = (na & ~(0xffu << 8 * k)) | uint32_t(a) << 8 * k;
            const uint32_t wb = (nb & ~(0xffu << 8 * k)) | uint32_t(b) << 8 * k;
            const uint32_t got = combine_bytes<OP, T>(wa, wb);
            for (int i = 0; i < 4; ++i) {
              const T x = T(uint8_t(wa >> 8 * i)), y = T(uint8_t(wb >> 8 * i));
              mismatches += uint8_t(got >> 8 * i) != uint8_t(combine<OP>(x, y));
            }
          }
    };
    auto each_op = [&](auto type_tag) {
      check_op(std::integral_constant<ReduceOp, ReduceOp::SUM>{}, type_tag);
      check_op(std::integral_constant<ReduceOp, ReduceOp::AVG>{}, type_tag);
      check_op(std::integral_constant<ReduceOp, ReduceOp::MIN>{}, type_tag);
      check_op(std::integral_constant<ReduceOp, ReduceOp::MAX>{}, type_tag);
      check_op(std::integral_constant<ReduceOp, ReduceOp::BAND>{}, type_tag);
      check_op(std::integral_constant<ReduceOp, ReduceOp::BOR>{}, type_tag);
      check_op(std::integral_constant<ReduceOp, ReduceOp::BXOR>{}, type_tag);
    };
    each_op(int8_t{});
    each_op(uint8_t{});
    CHECK(mismatches == 0);
  }
  // int32 SUM and PRODUCT wrap (two's complement, no signed overflow: UBSan runs this).
  {
    int32_t a[] = {std::numeric_limits<int32_t>::max(), 65536}, b[] = {2, 65536}, out[2];
    const int32_t* srcs[] = {a, b};
    int32_t* dsts[] = {out};
    cpu_reduce_range<int32_t, ReduceOp::SUM>(srcs, 2, dsts, 1, 0, 1, 2);
    CHECK(out[0] == std::numeric_limits<int32_t>::min() + 1);
    cpu_reduce_range<int32_t, ReduceOp::PRODUCT>(srcs, 2, dsts, 1, 1, 2, 2);
    CHECK(out[1] == 0);
  }
  // The bitwise ops (integers only): out of place over 3 sources across a
  // block boundary (int8 -1 is all ones, so BAND keeps the others' bits), and
  // in place.
  {
    const int64_t n = kCpuBlock + 3;
    std::vector<int8_t> a(n, int8_t(-1)), b(n, int8_t(0x5A)), c(n, int8_t(0x0F));
    const int8_t* srcs[] = {a.data(), b.data(), c.data()};
    std::vector<int8_t> out(n);
    int8_t* dsts[] = {out.data()};
    cpu_reduce_range<int8_t, ReduceOp::BAND>(srcs, 3, dsts, 1, 0, n, 3);
    CHECK(out[0] == 0x0A && out[n - 1] == 0x0A);
    cpu_reduce_range<int8_t, ReduceOp::BOR>(srcs, 3, dsts, 1, 0, n, 3);
    CHECK(out[0] == -1 && out[n - 1] == -1);
    cpu_reduce_range<int8_t, ReduceOp::BXOR>(srcs, 3, dsts, 1, 0, n, 3);
    CHECK(out[0] == int8_t(~0x5A ^ 0x0F) && out[n - 1] == int8_t(~0x5A ^ 0x0F));
    int64_t x[] = {int64_t(1) << 62, 6}, y[] = {(int64_t(1) << 62) | 1, 3}, o64[2];
    const int64_t* s64[] = {x, y};
    int64_t* d64[] = {x};  // in place: the destination is the first source
    cpu_reduce_range<int64_t, ReduceOp::BXOR>(s64, 2, d64, 1, 0, 2, 2);
    CHECK(x[0] == 1 && x[1] == 5);
    int64_t* d64b[] = {o64};
    cpu_reduce_range<int64_t, ReduceOp::BOR>(s64, 2, d64b, 1, 0, 2, 2);
    CHECK(o64[0] == ((int64_t(1) << 62) | 1) && o64[1] == 7);
  }
  return TEST_MAIN_RESULT();
}
