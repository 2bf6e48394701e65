// The one-launch ring for entries on one GPU (ring_one_gpu.h).
#include "ring_one_gpu.h"

#include "../../kernels/launch_shape.h"

namespace fastpar {
namespace cuda_p2p {
namespace {

constexpr int kRingThreads = 512;

template <typename T, ReduceOp OP>
__global__ void __launch_bounds__(kRingThreads) rotated_ring_kernel(const __grid_constant__ RotatedRingArgs a) {
  rotated_ring<T, OP>(a, int64_t(blockIdx.x) * blockDim.x + threadIdx.x, int64_t(gridDim.x) * blockDim.x);
}

}  // namespace

cudaError_t launch_rotated_ring(DType dt, ReduceOp op, const RotatedRingArgs& a, cudaStream_t stream) {
  if (a.n < 1 || a.n > cuda_kernels::kMaxReducePtrs || a.count <= 0 || a.segment < 1 || a.align < 1 ||
      a.align > int64_t(UINT32_MAX))
    return cudaErrorInvalidValue;
  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cuda_kernels::sm_count(device, &sms);
  if (err != cudaSuccess) return err;
  cudaError_t result = cudaErrorInvalidValue;
  FASTPAR_DISPATCH_DTYPE(dt, [&] {
    FASTPAR_DISPATCH_OP(op, [&] {
      int per_sm = 1;
      result = cuda_kernels::resident_blocks(reinterpret_cast<const void*>(rotated_ring_kernel<scalar_t, kOp>),
                                             kRingThreads, &per_sm);
      if (result != cudaSuccess) return;
      const int64_t units = a.vec ? a.count / (16 / int64_t(sizeof(scalar_t))) + 1 : a.count;
      const int64_t blocks = cuda_kernels::data_kernel_blocks(units, kRingThreads, sms, per_sm, 1);
      rotated_ring_kernel<scalar_t, kOp><<<unsigned(blocks), kRingThreads, 0, stream>>>(a);
      result = cudaGetLastError();
    });
  });
  return result;
}

}  // namespace cuda_p2p
}  // namespace fastpar
