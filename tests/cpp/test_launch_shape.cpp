// The data kernels' grid (csrc/core/kernels/launch_shape.h): one unit per
// thread up to 4 blocks per SM, and a GPU shared by n ranks' kernels gives
// each 1/n of it, so all of theirs fit on the GPU at once.
#include "check.h"
#include "core/kernels/launch_shape.h"

using fastpar::cuda_kernels::data_kernel_blocks;

int main() {
  // H200: 132 SMs, 512 threads a block, 4 blocks per SM.
  CHECK(data_kernel_blocks(0, 512, 132, 4, 1) == 1);
  CHECK(data_kernel_blocks(250, 512, 132, 4, 1) == 1);            // 1000 float32: one block
  CHECK(data_kernel_blocks(65537, 512, 132, 4, 1) == 129);        // 262,147 float32 in packs
  CHECK(data_kernel_blocks(750001, 512, 132, 4, 1) == 528);       // the whole GPU
  CHECK(data_kernel_blocks(750001, 512, 132, 4, 2) == 264);       // 2 ranks on the GPU: half each
  CHECK(data_kernel_blocks(750001, 512, 132, 4, 3) == 176);
  CHECK(data_kernel_blocks(750001, 512, 132, 4, 4) == 132);
  CHECK(3 * data_kernel_blocks(1 << 30, 512, 132, 4, 3) <= 132 * 4);  // all sharers' grids fit at once
  CHECK(data_kernel_blocks(65537, 512, 132, 4, 3) == 129);        // below the cap: unchanged
  CHECK(data_kernel_blocks(1 << 20, 512, 1, 4, 8) == 1);          // never below one block
  CHECK(data_kernel_blocks(1 << 20, 512, 132, 4, 0) == 528);      // 0 or 1: the whole GPU
  return TEST_MAIN_RESULT();
}
