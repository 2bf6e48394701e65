// The vector reduce loops (cpu_reduce_simd.h) give the scalar loop's bits:
// float32, float16 and bfloat16; SUM, AVG, PRODUCT, MIN, MAX; 1..12 sources
// (the unrolled counts and the generic one); random data with NaN (quiet and
// signalling, both signs), infinities, subnormals, signed zeros, overflowing
// sums and rounding ties; odd lengths and unaligned pointers; in place and
// to two destinations, plain and streaming stores; and the ring's fold steps.
// A NaN result must be NaN in both paths (its payload is not pinned down: see
// cpu_reduce_simd.h); every other result must match bit for bit.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "check.h"
#include "core/kernels/cpu_reduce.h"

using namespace fastpar;

namespace {

std::mt19937_64 rng(20261126);

const char* name_of(float) { return "float32"; }
const char* name_of(f16) { return "float16"; }
const char* name_of(bf16) { return "bfloat16"; }

uint32_t bits_of(float x) { return float_bits(x); }
uint32_t bits_of(f16 x) { return x.bits; }
uint32_t bits_of(bf16 x) { return x.bits; }
bool is_nan(float x) { return x != x; }
bool is_nan(f16 x) { return (x.bits & 0x7c00u) == 0x7c00u && (x.bits & 0x3ffu) != 0; }
bool is_nan(bf16 x) { return (x.bits & 0x7f80u) == 0x7f80u && (x.bits & 0x7fu) != 0; }

uint32_t pick(uint32_t n) { return uint32_t(rng() % n); }
float uniform(float lo, float hi) { return lo + (hi - lo) * float(rng() % 1000001) / 1e6f; }

// Special values by raw bits: exponent all ones (inf/NaN), zero (subnormal/0).
template <typename T> T from_bits(uint32_t b);  // 16-bit types only
template <> f16 from_bits<f16>(uint32_t b) { return f16{uint16_t(b)}; }
template <> bf16 from_bits<bf16>(uint32_t b) { return bf16{uint16_t(b)}; }

template <typename T> T random_value();
template <> float random_value<float>() {
  const uint32_t sign = pick(2) << 31;
  switch (pick(10)) {
    case 0: return bits_float(sign | 0x7f800000u | (1u + pick(0x7fffff)));  // NaN, quiet or signalling
    case 1: return bits_float(sign | 0x7f800000u);                          // inf
    case 2: return bits_float(sign | pick(0x800000));                       // subnormal or zero
    case 3: return bits_float(uint32_t(rng()));                             // anything
    case 4: return bits_float(sign | (0x7f000000u + pick(0x800000)));       // near FLT_MAX: sums overflow
    default: return uniform(-100.f, 100.f);
  }
}
template <typename H> H random_half(H (*round)(float), uint32_t exp_mask, uint32_t mant_mask) {
  const uint32_t sign = pick(2) << 15;
  switch (pick(10)) {
    case 0: return from_bits<H>(sign | exp_mask | (1u + pick(mant_mask)));  // NaN
    case 1: return from_bits<H>(sign | exp_mask);                           // inf
    case 2: return from_bits<H>(sign | pick(mant_mask + 1));                // subnormal or zero
    case 3: return from_bits<H>(uint32_t(rng()) & 0xffffu);                 // anything
    case 4: return from_bits<H>(sign | (exp_mask - (mant_mask + 1)) | pick(mant_mask + 1));  // largest finite binade
    default: return round(uniform(-8.f, 8.f));
  }
}
template <> f16 random_value<f16>() { return random_half<f16>(to_f16, 0x7c00u, 0x3ffu); }
template <> bf16 random_value<bf16>() { return random_half<bf16>(to_bf16, 0x7f80u, 0x7fu); }

template <typename T>
bool same(T scalar, T vec) {
  return is_nan(scalar) ? is_nan(vec) : bits_of(scalar) == bits_of(vec);
}

template <typename T>
int count_mismatches(const std::vector<T>& a, const std::vector<T>& b, int64_t from, int64_t n) {
  int bad = 0;
  for (int64_t i = from; i < from + n; ++i) {
    if (!same(a[size_t(i)], b[size_t(i)])) {
      if (bad < 3)
        std::fprintf(stderr, "  element %lld: scalar 0x%x, vector 0x%x\n", (long long)(i - from),
                     unsigned(bits_of(a[size_t(i)])), unsigned(bits_of(b[size_t(i)])));
      ++bad;
    }
  }
  return bad;
}

// Sources are slices of one buffer each at `offset` elements (unaligned for
// offset > 0); the scalar and the vector run get identical copies. Out of
// place: `outputs` destinations (1 or 2: the loops write them directly unless
// streaming; more are staged).
template <typename T, ReduceOp OP>
void check_reduce(CpuIsa isa, int nsrc, int64_t len, int64_t offset, bool in_place, bool streaming,
                  int outputs = 2) {
  const size_t cap = size_t(len + offset + 1);
  std::vector<std::vector<T>> in(static_cast<size_t>(nsrc), std::vector<T>(cap, T{}));
  for (auto& v : in)
    for (auto& x : v) x = random_value<T>();
  auto run = [&](CpuIsa which, std::vector<std::vector<T>>& bufs, std::vector<std::vector<T>>& outs) {
    std::vector<const T*> s;
    std::vector<T*> d;
    for (auto& v : bufs) s.push_back(v.data() + offset);
    if (in_place) {
      for (auto& v : bufs) d.push_back(v.data() + offset);
    } else {
      for (int o = 0; o < outputs; ++o) d.push_back(outs[size_t(o)].data() + offset);
    }
    cpu_reduce_range_isa<T, OP>(which, s.data(), nsrc, d.data(), int(d.size()), 0, len, nsrc, streaming);
  };
  auto a = in, b = in;
  std::vector<std::vector<T>> oa(size_t(outputs), std::vector<T>(cap, T{})), ob(oa);
  run(CpuIsa::kScalar, a, oa);
  run(isa, b, ob);
  auto& ra = in_place ? a : oa;
  auto& rb = in_place ? b : ob;
  for (size_t d = 0; d < ra.size(); ++d) {
    const int bad = count_mismatches(ra[d], rb[d], offset, len);
    if (bad) {
      std::fprintf(stderr, "%s %s %s: %d sources, %lld elements, offset %lld%s%s: %d differ (dst %zu)\n",
                   cpu_isa_name(isa), name_of(T{}),
                   op_name(OP), nsrc, (long long)len, (long long)offset, in_place ? ", in place" : "",
                   streaming ? ", streaming" : "", bad, d);
    }
    CHECK(bad == 0);
  }
}

// The ring's steps: fold (from T or from an fp32 accumulator) and finish.
template <typename T, ReduceOp OP>
void check_ring_steps(CpuIsa isa, int64_t len, int64_t offset) {
  const size_t cap = size_t(len + offset);
  std::vector<T> prev(cap), mine(cap);
  std::vector<float> acc(cap);
  for (auto& x : prev) x = random_value<T>();
  for (auto& x : mine) x = random_value<T>();
  for (auto& x : acc) x = random_value<float>();
  for (bool from_acc : {false, true}) {
    std::vector<float> oa(cap), ob(cap);
    const float* pa = from_acc ? acc.data() : nullptr;
    const T* pd = from_acc ? nullptr : prev.data();
    cpu_accumulate_range_isa<T, OP>(CpuIsa::kScalar, pa, pd, mine.data(), oa.data(), offset, offset + len);
    cpu_accumulate_range_isa<T, OP>(isa, pa, pd, mine.data(), ob.data(), offset, offset + len);
    CHECK(count_mismatches(oa, ob, offset, len) == 0);
    std::vector<T> fa = mine, fb = mine;  // in place, as the ring runs it
    cpu_finish_range_isa<T, OP>(CpuIsa::kScalar, pa, pd, fa.data(), fa.data(), offset, offset + len, 3);
    cpu_finish_range_isa<T, OP>(isa, pa, pd, fb.data(), fb.data(), offset, offset + len, 3);
    CHECK(count_mismatches(fa, fb, offset, len) == 0);
  }
}

template <typename T, ReduceOp OP>
void check_all(CpuIsa isa) {
  for (int nsrc : {1, 2, 3, 4, 5, 7, 8, 9, 12}) {
    for (int64_t len : {int64_t(0), int64_t(1), int64_t(7), int64_t(15), int64_t(17), int64_t(33), kCpuBlock - 1,
                        kCpuBlock + 9, int64_t(1500)}) {
      for (int64_t offset : {0, 1, 3}) {
        check_reduce<T, OP>(isa, nsrc, len, offset, /*in_place=*/true, /*streaming=*/false);
        check_reduce<T, OP>(isa, nsrc, len, offset, /*in_place=*/false, /*streaming=*/offset == 0);
        check_reduce<T, OP>(isa, nsrc, len, offset, /*in_place=*/false, /*streaming=*/false, /*outputs=*/1);
        check_reduce<T, OP>(isa, nsrc, len, offset, /*in_place=*/false, /*streaming=*/false, /*outputs=*/3);
      }
    }
  }
  for (int64_t len : {int64_t(1), int64_t(31), int64_t(1025)})
    for (int64_t offset : {0, 1}) check_ring_steps<T, OP>(isa, len, offset);
}

template <typename T>
void check_ops(CpuIsa isa) {
  check_all<T, ReduceOp::SUM>(isa);
  check_all<T, ReduceOp::AVG>(isa);
  check_all<T, ReduceOp::PRODUCT>(isa);
  check_all<T, ReduceOp::MIN>(isa);
  check_all<T, ReduceOp::MAX>(isa);
}

}  // namespace

int main() {
  // Known answers the vector paths must also give (2 lanes' worth of data so
  // the vector loop, not the tail, computes them).
  const CpuIsa best = cpu_isa_supported();
  std::printf("cpu_isa_supported: %s, cpu_isa: %s\n", cpu_isa_name(best), cpu_isa_name(cpu_isa()));
  for (int isa = int(CpuIsa::kScalar); isa <= int(best); ++isa) {
    // bf16: 1 + 2^-8 is a tie between 1 and 1 + 2^-7: rounds to even (1).
    std::vector<bf16> a(32, to_bf16(1.f)), b(32, bf16{0x3b80});  // 0x3b80 = 2^-8
    std::vector<bf16> o(32);
    const bf16* s[] = {a.data(), b.data()};
    bf16* d[] = {o.data()};
    cpu_reduce_range_isa<bf16, ReduceOp::SUM>(CpuIsa(isa), s, 2, d, 1, 0, 32, 2);
    CHECK(o[0].bits == 0x3f80 && o[31].bits == 0x3f80);
    // bf16: a subnormal result (2^-130 + 2^-130 = 2^-129 = bf16 0x0010) among
    // normal ones is kept, not flushed (AVX512-BF16's VCVTNE2PS2BF16 would
    // flush it: that vector takes the integer rounding), in an even lane of
    // one 32-element block and an odd lane of the next.
    std::vector<bf16> p(64, to_bf16(3.f)), q(64, to_bf16(0.5f)), r(64);
    p[6] = q[6] = p[32 + 9] = q[32 + 9] = bf16{0x0008};  // 2^-130
    const bf16* ps[] = {p.data(), q.data()};
    bf16* pd[] = {r.data()};
    cpu_reduce_range_isa<bf16, ReduceOp::SUM>(CpuIsa(isa), ps, 2, pd, 1, 0, 64, 2);
    CHECK(r[6].bits == 0x0010 && r[32 + 9].bits == 0x0010 && r[0].bits == to_bf16(3.5f).bits &&
          r[63].bits == to_bf16(3.5f).bits);
    // fp16: 2048 + 1 + 1 accumulates in fp32 (2050), not 2048 + 1 -> 2048 twice.
    std::vector<f16> x(32, to_f16(2048.f)), y(32, to_f16(1.f)), z(32);
    const f16* hs[] = {x.data(), y.data(), y.data()};
    f16* hd[] = {z.data()};
    cpu_reduce_range_isa<f16, ReduceOp::SUM>(CpuIsa(isa), hs, 3, hd, 1, 0, 32, 3);
    CHECK(to_float(z[0]) == 2050.f && to_float(z[31]) == 2050.f);
    // fp16 NaN results are the canonical 0x7e00 / 0xfe00 whatever the payload.
    std::vector<f16> n1(32, f16{0xfd01}), n2(32, f16{0x3c00}), n3(32);
    const f16* ns[] = {n1.data(), n2.data()};
    f16* nd[] = {n3.data()};
    cpu_reduce_range_isa<f16, ReduceOp::MAX>(CpuIsa(isa), ns, 2, nd, 1, 0, 32, 2);
    CHECK(n3[0].bits == 0xfe00 && n3[31].bits == 0xfe00);
  }
  if (best == CpuIsa::kScalar) std::printf("no AVX2/AVX-512 on this CPU: only the scalar path was checked\n");
  for (int isa = int(CpuIsa::kAvx2); isa <= int(best); ++isa) {
    check_ops<float>(CpuIsa(isa));
    check_ops<f16>(CpuIsa(isa));
    check_ops<bf16>(CpuIsa(isa));
    std::printf("%s checked against the scalar path\n", cpu_isa_name(CpuIsa(isa)));
  }
  return TEST_MAIN_RESULT();
}
