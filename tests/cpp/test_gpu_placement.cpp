// Which ranks share a GPU (csrc/torch/distributed/gpu_placement.h), from the
// identities the CUDA IPC setup exchanges: ranks on one GPU, on distinct
// GPUs, on MIG instances of one board (one bus id, distinct UUIDs), and with
// a GPU CUDA could not name. Every rank computes this from the same strings,
// so it is checked from every rank's side.
#include <string>
#include <vector>

#include "check.h"
#include "torch/distributed/gpu_placement.h"

using namespace fastpar::cuda_ipc;

static const std::string kBoardA = "00000000:19:00.0";
static const std::string kBoardB = "00000000:3B:00.0";
static const std::string kUuid1 = "1a2b3c4d-0000-1111-2222-333344445555";
static const std::string kUuid2 = "9f8e7d6c-0000-1111-2222-333344445555";

static void identity_text() {
  const unsigned char b[16] = {0x1a, 0x2b, 0x3c, 0x4d, 0x00, 0x00, 0x11, 0x11,
                               0x22, 0x22, 0x33, 0x33, 0x44, 0x44, 0x55, 0x55};
  CHECK(uuid_text(b) == kUuid1);
  const std::string id = gpu_identity(kBoardA, kUuid1);
  CHECK(id == kBoardA + "/" + kUuid1);
  CHECK(id.find(' ') == std::string::npos);  // the cfg line is split on spaces
  CHECK(gpu_bus(id) == kBoardA && gpu_uuid(id) == kUuid1);
  CHECK(gpu_identity("", kUuid1) == unknown_gpu() && gpu_identity(kBoardA, "") == unknown_gpu());
  CHECK(gpu_bus(unknown_gpu()).empty() && gpu_uuid(unknown_gpu()).empty());
}

static void sameness() {
  const std::string a1 = gpu_identity(kBoardA, kUuid1), a2 = gpu_identity(kBoardA, kUuid2);
  const std::string b1 = gpu_identity(kBoardB, kUuid1);
  CHECK(same_gpu(a1, a1));
  CHECK(!same_gpu(a1, a2));  // MIG instances: one bus id, two GPUs
  CHECK(!same_gpu(a1, b1));
  CHECK(!same_gpu(unknown_gpu(), unknown_gpu()));  // nothing is known to be shared
  CHECK(sibling_mig_instances(a1, a2) && sibling_mig_instances(a2, a1));
  CHECK(!sibling_mig_instances(a1, a1) && !sibling_mig_instances(a1, b1));
  CHECK(!sibling_mig_instances(a1, unknown_gpu()) && !sibling_mig_instances(unknown_gpu(), unknown_gpu()));
}

static void placement() {
  const std::string a1 = gpu_identity(kBoardA, kUuid1), a2 = gpu_identity(kBoardA, kUuid2);
  const std::string b1 = gpu_identity(kBoardB, kUuid1);
  // Four ranks on one GPU (MPS): every rank sees all four.
  for (int r = 0; r < 4; ++r) {
    const GpuPlacement p = place_ranks({a1, a1, a1, a1}, r);
    CHECK(p.group_shares_gpu && p.ranks_on_my_gpu == 4 && p.most_on_a_gpu == 4);
  }
  // One rank per GPU.
  for (int r = 0; r < 2; ++r) {
    const GpuPlacement p = place_ranks({a1, b1}, r);
    CHECK(!p.group_shares_gpu && p.ranks_on_my_gpu == 1 && p.most_on_a_gpu == 1);
  }
  // Two MIG instances of one board: two GPUs, not one.
  for (int r = 0; r < 2; ++r) {
    const GpuPlacement p = place_ranks({a1, a2}, r);
    CHECK(!p.group_shares_gpu && p.ranks_on_my_gpu == 1 && p.most_on_a_gpu == 1);
  }
  // Two on a1, one on a2, one on b1: the sharers know, the others count one.
  {
    const std::vector<std::string> g = {a1, a2, a1, b1};
    const int want_mine[] = {2, 1, 2, 1};
    for (int r = 0; r < 4; ++r) {
      const GpuPlacement p = place_ranks(g, r);
      CHECK(p.group_shares_gpu && p.most_on_a_gpu == 2 && p.ranks_on_my_gpu == want_mine[r]);
    }
  }
  // A GPU CUDA could not name: not known to share, but the grid size counts
  // it as sharing with every rank (grids too large could never all be resident).
  for (int r = 0; r < 3; ++r) {
    const GpuPlacement p = place_ranks({a1, unknown_gpu(), b1}, r);
    CHECK(!p.group_shares_gpu && p.ranks_on_my_gpu == 1 && p.most_on_a_gpu == 3);
  }
}

int main() {
  identity_text();
  sameness();
  placement();
  return TEST_MAIN_RESULT();
}
