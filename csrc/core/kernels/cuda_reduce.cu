// Launchers for cuda_reduce.cuh: dtype / op dispatch, the alignment test that
// picks the 16-byte path, and the launch shape.
#include "cuda_reduce.cuh"
#include "cuda_reduce_launch.h"
#include "launch_shape.h"

#include <atomic>
#include <map>
#include <mutex>
#include <utility>

namespace fastpar {
namespace cuda_kernels {
namespace {

static_assert(kMaxReducePtrs == kMaxPtrs, "launcher and kernel disagree on the pointer limit");

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Blocks of `kernel` for `units` units of work (packs, or elements on the
// scalar path): at most the blocks resident on every SM, divided among the
// `sharers` ranks whose kernels share this GPU (launch_shape.h).
template <class Kernel>
cudaError_t grid_for(Kernel kernel, int64_t units, unsigned* blocks, int sharers = 1) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  int sms = 0, per_sm = 0;
  err = sm_count(device, &sms);
  if (err == cudaSuccess) err = resident_blocks(reinterpret_cast<const void*>(kernel), kThreads, &per_sm);
  if (err != cudaSuccess) return err;
  *blocks = unsigned(data_kernel_blocks(units, kThreads, sms, per_sm, sharers));
  return cudaSuccess;
}

template <typename T>
int64_t work_units(int64_t count, bool vec) {
  return vec ? count / vec_width<T>() + count % vec_width<T>() : count;
}

}  // namespace

// The SM count of `device`, asked once per device: cudaDeviceGetAttribute per
// launch was a measurable share of a small call's host time (one per launch
// in the H100 profile). Racing first calls store the same value.
cudaError_t sm_count(int device, int* sms) {
  constexpr int kCached = 64;
  static std::atomic<int> cache[kCached];
  if (device >= 0 && device < kCached) {
    *sms = cache[device].load(std::memory_order_relaxed);
    if (*sms > 0) return cudaSuccess;
  }
  const cudaError_t err = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  if (device >= 0 && device < kCached) cache[device].store(*sms, std::memory_order_relaxed);
  return cudaSuccess;
}

// Asked once per kernel instance and thread count: a full SM's worth of
// threads is 4 blocks of 512 on sm_80/sm_90, but a kernel at 64 registers per
// thread fits only 2, and a grid sized for 4 would run in two waves. Keyed by
// the kernel itself: the ops of one dtype share a function type but not their
// registers.
cudaError_t resident_blocks(const void* kernel, int threads, int* out) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int> cached;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cached.find({kernel, threads});
  if (it == cached.end()) {
    int b = 0;
    const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, threads, 0);
    if (e != cudaSuccess) return e;
    it = cached.emplace(std::make_pair(kernel, threads), b < 1 ? 1 : b).first;
  }
  *out = it->second;
  return cudaSuccess;
}

cudaError_t launch_reduce(DType dt, ReduceOp op, const ReduceLaunch& a, cudaStream_t stream) {
  if (a.count == 0) return cudaSuccess;
  if (a.nsrc < 1 || a.nsrc > kMaxPtrs || a.ndst < 0 || a.ndst > kMaxPtrs) return cudaErrorInvalidValue;
  bool vec = true;
  for (int s = 0; s < a.nsrc; ++s) vec = vec && aligned16(a.srcs[s]);
  for (int d = 0; d < a.ndst; ++d) vec = vec && aligned16(a.dsts[d]);
  // The dispatch lambdas return void (the macros' switch has no final return)
  // and hand their result out through `result`, which stays an error for an
  // op without a kernel (the bitwise ones: the route never sends them here).
  cudaError_t result = cudaErrorInvalidValue;
  FASTPAR_DISPATCH_DTYPE(dt, [&] {
    FASTPAR_DISPATCH_OP(op, [&] {
      const ReducePtrs<scalar_t> p = reduce_ptrs<scalar_t>(a);
      unsigned blocks = 0;
      result = grid_for(reduce_kernel<scalar_t, kOp>, work_units<scalar_t>(a.count, vec), &blocks, a.gpu_sharers);
      if (result != cudaSuccess) return;
      reduce_kernel<scalar_t, kOp><<<blocks, kThreads, 0, stream>>>(p, a.count, a.contributions, vec);
      result = cudaGetLastError();
    });
  });
  return result;
}

namespace {

template <typename T, ReduceOp OP>
struct LoadReduceKernel {
  static cudaError_t run() {
    cudaFuncAttributes attr;
    return cudaFuncGetAttributes(&attr, reduce_kernel<T, OP>);
  }
};

}  // namespace

cudaError_t preload_reduce_kernels() { return for_each_kernel<LoadReduceKernel>(cudaSuccess); }

namespace {

template <bool kFinish>
cudaError_t launch_ring(DType dt, ReduceOp op, const void* prev_acc, const void* prev_data,
                        const void* mine, void* out, int64_t count, int contributions,
                        cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const bool vec = aligned16(prev_acc ? prev_acc : prev_data) && aligned16(mine) && aligned16(out);
  cudaError_t result = cudaErrorInvalidValue;  // as in launch_reduce
  FASTPAR_DISPATCH_DTYPE(dt, [&] {
    FASTPAR_DISPATCH_OP(op, [&] {
      using A = acc_t<scalar_t>;
      unsigned blocks = 0;
      result = grid_for(ring_step_kernel<scalar_t, kOp, kFinish>, work_units<scalar_t>(count, vec), &blocks);
      if (result != cudaSuccess) return;
      ring_step_kernel<scalar_t, kOp, kFinish><<<blocks, kThreads, 0, stream>>>(
          static_cast<const A*>(prev_acc), static_cast<const scalar_t*>(prev_data),
          static_cast<const scalar_t*>(mine), kFinish ? nullptr : static_cast<A*>(out),
          kFinish ? static_cast<scalar_t*>(out) : nullptr, count, contributions, vec);
      result = cudaGetLastError();
    });
  });
  return result;
}

}  // namespace

cudaError_t launch_ring_fold(DType dt, ReduceOp op, const void* prev_acc, const void* prev_data,
                             const void* mine, void* out_acc, int64_t count, cudaStream_t stream) {
  return launch_ring<false>(dt, op, prev_acc, prev_data, mine, out_acc, count, 1, stream);
}

cudaError_t launch_ring_finish(DType dt, ReduceOp op, const void* prev_acc, const void* prev_data,
                               const void* mine, void* out, int64_t count, int contributions,
                               cudaStream_t stream) {
  return launch_ring<true>(dt, op, prev_acc, prev_data, mine, out, count, contributions, stream);
}

}  // namespace cuda_kernels
}  // namespace fastpar
