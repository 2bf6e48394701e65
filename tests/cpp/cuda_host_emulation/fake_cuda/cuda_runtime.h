// Test-only: the kernel-language keywords as host code, and the thread
// coordinates as globals that run_grid (the test) sets before each "thread".
#pragma once

#include "cuda_runtime_api.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(x)

inline thread_local dim3 blockIdx, threadIdx, blockDim, gridDim;
