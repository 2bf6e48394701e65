// The kernel launchers of core/kernels/cuda_reduce.cu for the host emulation: the
// same dispatch and 16-byte alignment rule, with run_grid (every block, every
// thread, one after the other) in place of <<<...>>>.
#pragma once

#include <cstdint>

#include "csrc/core/kernels/cuda_reduce.cuh"
#include "csrc/core/kernels/cuda_reduce_launch.h"

namespace fastpar {
namespace cuda_kernels {

// The grid the emulated launches use: small and odd, so that grid-stride
// loops wrap several times and threads get unequal shares.
inline unsigned g_blocks = 3, g_threads = 5;

template <class F>
inline void run_grid(F body) {
  gridDim.x = g_blocks;
  blockDim.x = g_threads;
  for (unsigned b = 0; b < g_blocks; ++b)
    for (unsigned t = 0; t < g_threads; ++t) {
      blockIdx.x = b;
      threadIdx.x = t;
      body();
    }
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline cudaError_t launch_reduce(DType dt, ReduceOp op, const ReduceLaunch& a, cudaStream_t) {
  if (a.count == 0) return cudaSuccess;
  if (fake_cuda::launch_refused()) return cudaGetLastError();
  fake_cuda::stream_ops.bytes += a.count * dtype_size(dt) * (a.nsrc + a.ndst);
  bool vec = true;
  for (int s = 0; s < a.nsrc; ++s) vec = vec && aligned16(a.srcs[s]);
  for (int d = 0; d < a.ndst; ++d) vec = vec && aligned16(a.dsts[d]);
  FASTPAR_DISPATCH_DTYPE(dt, [&] {
    FASTPAR_DISPATCH_OP(op, [&] {
      const ReducePtrs<scalar_t> p = reduce_ptrs<scalar_t>(a);
      run_grid([&] { reduce_kernel<scalar_t, kOp>(p, a.count, a.contributions, vec); });
    });
  });
  // As the real launcher: whatever error the thread has pending, its own or not.
  return cudaGetLastError();
}

template <bool kFinish>
inline cudaError_t launch_ring(DType dt, ReduceOp op, const void* prev_acc, const void* prev_data, const void* mine,
                        void* out, int64_t count, int contributions) {
  if (count == 0) return cudaSuccess;
  ++fake_cuda::stream_ops.launches;
  const bool vec = aligned16(prev_acc ? prev_acc : prev_data) && aligned16(mine) && aligned16(out);
  FASTPAR_DISPATCH_DTYPE(dt, [&] {
    FASTPAR_DISPATCH_OP(op, [&] {
      using A = acc_t<scalar_t>;
      const int64_t es = sizeof(scalar_t), acc = sizeof(A);
      fake_cuda::stream_ops.bytes += count * ((prev_acc ? acc : es) + es + (kFinish ? es : acc));
      run_grid([&] {
        ring_step_kernel<scalar_t, kOp, kFinish>(
            static_cast<const A*>(prev_acc), static_cast<const scalar_t*>(prev_data),
            static_cast<const scalar_t*>(mine), kFinish ? nullptr : static_cast<A*>(out),
            kFinish ? static_cast<scalar_t*>(out) : nullptr, count, contributions, vec);
      });
    });
  });
  return cudaSuccess;
}

inline cudaError_t launch_ring_fold(DType dt, ReduceOp op, const void* prev_acc, const void* prev_data, const void* mine,
                             void* out_acc, int64_t count, cudaStream_t) {
  return launch_ring<false>(dt, op, prev_acc, prev_data, mine, out_acc, count, 1);
}

inline cudaError_t launch_ring_finish(DType dt, ReduceOp op, const void* prev_acc, const void* prev_data, const void* mine,
                               void* out, int64_t count, int contributions, cudaStream_t) {
  return launch_ring<true>(dt, op, prev_acc, prev_data, mine, out, count, contributions);
}

}  // namespace cuda_kernels
}  // namespace fastpar

#include "csrc/core/executors/cuda_p2p/ring_one_gpu.h"

namespace fastpar {
namespace cuda_p2p {

// The one-launch ring (ring_one_gpu.cu): the same body, thread by thread over
// the emulated grid.
inline std::atomic<int64_t> g_rotated_ring_launches{0};

inline cudaError_t launch_rotated_ring(DType dt, ReduceOp op, const RotatedRingArgs& a, cudaStream_t) {
  if (a.n < 1 || a.n > cuda_kernels::kMaxReducePtrs || a.count <= 0 || a.segment < 1 || a.align < 1)
    return cudaErrorInvalidValue;
  if (fake_cuda::launch_refused()) return cudaGetLastError();
  ++g_rotated_ring_launches;
  fake_cuda::stream_ops.bytes += 2 * int64_t(a.n) * a.count * dtype_size(dt);  // every entry read and written once
  FASTPAR_DISPATCH_DTYPE(dt, [&] {
    FASTPAR_DISPATCH_OP(op, [&] {
      cuda_kernels::run_grid([&] {
        rotated_ring<scalar_t, kOp>(a, int64_t(blockIdx.x) * blockDim.x + threadIdx.x,
                                    int64_t(gridDim.x) * blockDim.x);
      });
    });
  });
  return cudaGetLastError();
}

}  // namespace cuda_p2p
}  // namespace fastpar

