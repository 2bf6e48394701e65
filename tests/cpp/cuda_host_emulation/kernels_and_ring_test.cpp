// Runs the CUDA kernels (core/kernels/cuda_reduce.cuh) and the cuda_p2p ring
// executor on the host, thread by thread, against the CPU code they must agree
// with bit for bit:
//   reduce_kernel          vs cpu_reduce_range            (every dtype, op, 1-8 sources,
//                                                          1-3 destinations, aliasing,
//                                                          aligned and misaligned, odd grids)
//   one-launch allreduce   vs cpu_reduce_range            (cuda_ops.cpp's path for k <= 8
//                                                          entries on one GPU: k sources that
//                                                          are also the k destinations)
//   cuda_p2p::ring_allreduce vs cpu_local::allreduce_ring (1-5 ranks, multi-window, staging
//                                                          on some ranks, peer reads on others;
//                                                          and every rank on one device and
//                                                          stream, which must use no events:
//                                                          segment by segment with reduce_kernel
//                                                          for n <= 8, the schedule in stream
//                                                          order for n = 9; on several
//                                                          devices, events from the cache,
//                                                          not created per call)
// Built against fake_cuda/ (no GPU, no CUDA toolkit); tests/tooling/test_cuda_host_emulation.py
// compiles and runs it. Exit status 0 = every check passed.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <type_traits>
#include <vector>

#include "csrc/core/executors/cpu_local/cpu_local.h"
#include "emulated_launchers.h"

// The executor under test, compiled here against the fake runtime.
#include "csrc/core/transport/cuda_p2p/handle_cache.cpp"
#include "csrc/core/executors/cuda_p2p/ring_allreduce.cpp"

using namespace fastpar;

namespace {

std::mt19937 rng(1);
int64_t checks = 0, failures = 0;

template <typename T>
DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::F32;
  else if constexpr (std::is_same_v<T, double>) return DType::F64;
  else if constexpr (std::is_same_v<T, f16>) return DType::F16;
  else if constexpr (std::is_same_v<T, bf16>) return DType::BF16;
  else if constexpr (std::is_same_v<T, int8_t>) return DType::I8;
  else if constexpr (std::is_same_v<T, uint8_t>) return DType::U8;
  else if constexpr (std::is_same_v<T, int32_t>) return DType::I32;
  else return DType::I64;
}

// Values whose float sums round (so order matters) and whose integer
// products stay small.
template <typename T>
T sample(ReduceOp op) {
  std::uniform_real_distribution<float> u(-100, 100);
  std::uniform_int_distribution<int> i(-100, 100);
  const float f = op == ReduceOp::PRODUCT ? 1.0f + u(rng) / 1000 : u(rng);
  if constexpr (std::is_same_v<T, f16>) return to_f16(f);
  else if constexpr (std::is_same_v<T, bf16>) return to_bf16(f);
  else if constexpr (is_floating<T>()) return T(f);
  else return T(op == ReduceOp::PRODUCT ? i(rng) % 3 : i(rng));
}

// 16-byte aligned storage viewed `offset` elements in (offset 1 misaligns).
struct Storage {
  std::vector<uint4> words;
  template <typename T>
  T* view(int64_t count, int offset) {
    words.assign(static_cast<size_t>((count + offset) * int64_t(sizeof(T)) / 16 + 2), uint4{});
    return reinterpret_cast<T*>(words.data()) + offset;
  }
};

void expect_equal(const void* actual, const void* expected, size_t bytes, const char* what) {
  ++checks;
  if (bytes == 0 || std::memcmp(actual, expected, bytes) == 0) return;
  if (++failures <= 20) std::fprintf(stderr, "MISMATCH %s\n", what);
}

template <typename T, ReduceOp OP>
void check_reduce_kernel() {
  char what[160];
  for (int64_t count : {0, 1, 3, 7, 8, 15, 16, 17, 100, 1001})
    for (int nsrc = 1; nsrc <= 8; ++nsrc)
      for (int ndst : {1, 2, 3})
        for (int offset : {0, 1})
          for (bool in_place : {false, true}) {
            std::vector<Storage> src_store(static_cast<size_t>(nsrc)), dst_store(static_cast<size_t>(ndst));
            std::vector<T*> src, dst;
            std::vector<std::vector<T>> original;
            for (auto& s : src_store) {
              src.push_back(s.view<T>(count, offset));
              for (int64_t i = 0; i < count; ++i) src.back()[i] = sample<T>(OP);
              original.emplace_back(src.back(), src.back() + count);
            }
            // Destination 1 has the other alignment: one misaligned pointer must
            // send the whole launch down the scalar path.
            for (int d = 0; d < ndst; ++d) dst.push_back(dst_store[size_t(d)].view<T>(count, d == 1 ? 1 - offset : offset));
            if (in_place) dst[0] = src[0];
            std::vector<const T*> ref_src;
            for (auto& o : original) ref_src.push_back(o.data());
            std::vector<T> expected(static_cast<size_t>(count));
            T* ref_dst = expected.data();
            cpu_reduce_range<T, OP>(ref_src.data(), nsrc, &ref_dst, 1, 0, count, nsrc);
            cuda_kernels::ReduceLaunch l;
            for (int s = 0; s < nsrc; ++s) l.srcs[s] = src[size_t(s)];
            for (int d = 0; d < ndst; ++d) l.dsts[d] = dst[size_t(d)];
            l.nsrc = nsrc;
            l.ndst = ndst;
            l.count = count;
            l.contributions = nsrc;
            cuda_kernels::launch_reduce(dtype_of<T>(), OP, l, nullptr);
            for (int d = 0; d < ndst; ++d) {
              std::snprintf(what, sizeof(what), "reduce_kernel %s %s count=%ld nsrc=%d dst=%d offset=%d in_place=%d",
                            dtype_name(dtype_of<T>()), op_name(OP), long(count), nsrc, d, offset, int(in_place));
              expect_equal(dst[size_t(d)], expected.data(), size_t(count) * sizeof(T), what);
            }
          }
  // A set guard word turns the kernel into a no-op.
  Storage a, b;
  T* s = a.view<T>(64, 0);
  T* d = b.view<T>(64, 0);
  for (int i = 0; i < 64; ++i) s[i] = sample<T>(OP);
  const std::vector<T> before(d, d + 64);
  const uint32_t failed = 1;
  cuda_kernels::ReduceLaunch l;
  l.srcs[0] = s;
  l.dsts[0] = d;
  l.nsrc = l.ndst = 1;
  l.count = 64;
  l.guard = &failed;
  cuda_kernels::launch_reduce(dtype_of<T>(), OP, l, nullptr);
  expect_equal(d, before.data(), 64 * sizeof(T), "guarded reduce_kernel wrote its output");
}

// cuda_ops.cpp's allreduce_one_launch: every entry is both a source and a
// destination of a single launch (entries on one GPU; different buffers, some
// misaligned), against the in-order CPU reduction of the original values.
template <typename T, ReduceOp OP>
void check_one_launch_allreduce() {
  char what[160];
  for (int64_t count : {1, 3, 16, 17, 1001})
    for (int k = 2; k <= 8; ++k)
      for (int offset : {0, 1}) {
        std::vector<Storage> store(static_cast<size_t>(k));
        std::vector<T*> t;
        std::vector<std::vector<T>> original;
        for (int i = 0; i < k; ++i) {
          // Entry k-1 misaligned when offset is 0 (and the others when 1): a
          // single misaligned entry sends the launch down the scalar path.
          t.push_back(store[size_t(i)].view<T>(count, i == k - 1 ? 1 - offset : offset));
          for (int64_t e = 0; e < count; ++e) t.back()[e] = sample<T>(OP);
          original.emplace_back(t.back(), t.back() + count);
        }
        std::vector<const T*> ref_src;
        for (auto& o : original) ref_src.push_back(o.data());
        std::vector<T> expected(static_cast<size_t>(count));
        T* ref_dst = expected.data();
        cpu_reduce_range<T, OP>(ref_src.data(), k, &ref_dst, 1, 0, count, k);
        cuda_kernels::ReduceLaunch l;
        for (int i = 0; i < k; ++i) {
          l.srcs[i] = t[size_t(i)];
          l.dsts[i] = t[size_t(i)];
        }
        l.nsrc = l.ndst = k;
        l.count = count;
        l.contributions = k;
        cuda_kernels::launch_reduce(dtype_of<T>(), OP, l, nullptr);
        for (int i = 0; i < k; ++i) {
          std::snprintf(what, sizeof(what), "one-launch allreduce %s %s count=%ld k=%d offset=%d entry=%d",
                        dtype_name(dtype_of<T>()), op_name(OP), long(count), k, offset, i);
          expect_equal(t[size_t(i)], expected.data(), size_t(count) * sizeof(T), what);
        }
      }
}

template <typename T, ReduceOp OP>
void check_ring_executor() {
  char what[160];
  const int64_t ts = sizeof(T);
  // n = 9: more ranks than reduce_kernel reads, so one device runs the
  // schedule in stream order instead of segment by segment.
  for (int n : {1, 2, 3, 4, 5, 9})
    for (int64_t count : {0, 1, 3, 17, 100, 1000, 4099})
      for (int64_t segment_bytes : {64, 100, 1 << 20})  // 100: windows start misaligned
        for (int staging_mask : {0, 5, 31, -1}) {       // which ranks lack peer access;
                                                        // -1: all ranks on device 0, one stream
          const int64_t seg = std::max<int64_t>(1, segment_bytes / ts);
          const int64_t align = std::max<int64_t>(1, 64 / ts);  // as cuda_ops.cpp and cpu_ops.cpp
          std::vector<std::vector<T>> cpu(static_cast<size_t>(n), std::vector<T>(static_cast<size_t>(count)));
          for (auto& v : cpu)
            for (auto& x : v) x = sample<T>(OP);
          std::vector<std::vector<T>> gpu = cpu;
          std::vector<T*> cpu_ptrs;
          for (auto& v : cpu) cpu_ptrs.push_back(v.data());
          const cpu_local::ParallelFor serial = [](int64_t b, int64_t e, int64_t,
                                                   const std::function<void(int64_t, int64_t)>& f) {
            if (b < e) f(b, e);
          };
          cpu_local::allreduce_ring<T, OP>(serial, cpu_ptrs, count, seg, align);
          const int64_t span = std::min(seg * n, count);
          std::vector<Storage> acc(static_cast<size_t>(n)), staging(static_cast<size_t>(n));
          std::vector<cuda_p2p::RingRank> ranks;
          for (int r = 0; r < n; ++r) {
            void* a = acc[size_t(r)].view<double>(span, 0);
            const bool one_device = staging_mask < 0;
            void* st = !one_device && ((staging_mask >> r) & 1) ? staging[size_t(r)].view<double>(span, 0) : nullptr;
            // cuda_ops.cpp passes no accumulator on one device with n <= 8.
            ranks.push_back({one_device ? 0 : r, nullptr, gpu[size_t(r)].data(), one_device && n <= 8 ? nullptr : a, st});
          }
          const std::vector<std::vector<T>> input = gpu;
          // On one device both forms (one launch; one launch per segment).
          for (int form = 0; form < (staging_mask < 0 ? 2 : 1); ++form) {
            for (int r = 0; r < n; ++r) std::copy(input[size_t(r)].begin(), input[size_t(r)].end(), gpu[size_t(r)].begin());
            const int64_t events_before = fake_cuda::event_calls;
            const cudaError_t err =
                cuda_p2p::ring_allreduce({dtype_of<T>(), OP, count, seg, align, form == 0}, ranks);
            ++checks;
            if (err != cudaSuccess && ++failures <= 20) std::fprintf(stderr, "ring_allreduce returned %d\n", int(err));
            ++checks;
            if (staging_mask < 0 && fake_cuda::event_calls != events_before && ++failures <= 20)
              std::fprintf(stderr, "one-stream ring made %ld event calls\n", long(fake_cuda::event_calls - events_before));
            for (int r = 0; r < n; ++r) {
              std::snprintf(what, sizeof(what), "ring %s %s n=%d count=%ld segment_bytes=%ld staging=%d form=%s rank=%d",
                            dtype_name(dtype_of<T>()), op_name(OP), n, long(count), long(segment_bytes), staging_mask,
                            form == 0 ? "one launch" : "per segment", r);
              expect_equal(gpu[size_t(r)].data(), cpu[size_t(r)].data(), size_t(count) * size_t(ts), what);
            }
          }
        }
}

}  // namespace

int main() {
  for (int d = 0; d < 8; ++d)
    for (int o = 0; o < 5; ++o) {
      const DType dt = DType(d);
      const ReduceOp op = ReduceOp(o);
      FASTPAR_DISPATCH_DTYPE(dt, [&] {
        FASTPAR_DISPATCH_OP(op, [&] {
          for (unsigned blocks : {1u, 3u})
            for (unsigned threads : {1u, 5u, 64u}) {
              cuda_kernels::g_blocks = blocks;
              cuda_kernels::g_threads = threads;
              check_reduce_kernel<scalar_t, kOp>();
            }
          cuda_kernels::g_blocks = 2;
          cuda_kernels::g_threads = 7;
          check_one_launch_allreduce<scalar_t, kOp>();
          check_ring_executor<scalar_t, kOp>();
        });
      });
    }
  // Thousands of multi-device ring calls above: events come from the cache,
  // one per device (9 devices at most), never one per call.
  ++checks;
  if (fake_cuda::events_created > 9 && ++failures <= 20)
    std::fprintf(stderr, "ring calls created %ld events (the cache holds one per device)\n",
                 long(fake_cuda::events_created.load()));
  // Streams: a backend's p2p streams go back to the cache and the next
  // backend on that device takes the same ones, in creation order.
  {
    std::vector<cudaStream_t> first, again, other;
    const int64_t made = fake_cuda::streams_created;
    ++checks;
    if ((cuda_p2p::take_streams(1, 3, &first) != cudaSuccess || first.size() != 3 ||
         fake_cuda::streams_created != made + 3) && ++failures <= 20)
      std::fprintf(stderr, "take_streams(1, 3) made %ld streams\n", long(fake_cuda::streams_created - made));
    cuda_p2p::give_back_streams(1, first);
    ++checks;
    if ((cuda_p2p::take_streams(1, 4, &again) != cudaSuccess || again.size() != 4 ||
         !std::equal(first.begin(), first.end(), again.begin()) || fake_cuda::streams_created != made + 4) &&
        ++failures <= 20)
      std::fprintf(stderr, "take_streams after give_back did not reuse the 3 streams in order\n");
    ++checks;
    if ((cuda_p2p::take_streams(2, 1, &other) != cudaSuccess || other.size() != 1 || other[0] == again[0] ||
         fake_cuda::current_device != 0) && ++failures <= 20)
      std::fprintf(stderr, "take_streams on another device reused a stream or left the device changed\n");
    cuda_p2p::give_back_streams(1, again);
    cuda_p2p::give_back_streams(2, other);
  }
  std::printf("%ld checks, %ld failures, %ld staged or copied transfers\n", long(checks), long(failures),
              long(fake_cuda::copies));
  return failures == 0 && fake_cuda::copies > 0 ? 0 : 1;
}
