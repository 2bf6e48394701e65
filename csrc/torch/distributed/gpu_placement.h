// Which ranks of a group sit on the same GPU, from the GPU identities the
// CUDA IPC setup's cfg round exchanges (cuda_ipc_rendezvous.cpp). It picks
// routes (NCCL refuses two ranks on one GPU), the data kernels' share of the
// GPU, the fused grids' size and the fence scope, so every rank must reach
// the same answer: it is a pure function of the exchanged strings.
//
// A GPU is named by its PCI bus id and its UUID together. The bus id alone
// would take two MIG instances of one GPU for one GPU: they share the board's
// bus id, but each has its own UUID, its own SMs and memory, and CUDA IPC
// does not cross them. Where a UUID is the board's on both (a driver that
// reports it so), the pair is no worse than the bus id alone.
//
// Pure, host-only and torch-free so that ctest checks it
// (tests/cpp/test_gpu_placement.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace fastpar {
namespace cuda_ipc {

// The identity of a GPU whose bus id or UUID CUDA could not give: matches
// nothing, not even itself (but counts as sharing for the grid size below).
inline const std::string& unknown_gpu() {
  static const std::string u = "unknown";
  return u;
}

// 16 UUID bytes as 8-4-4-4-12 lowercase hex (nvidia-smi's form, without its
// GPU- or MIG- prefix, which the bytes do not say).
inline std::string uuid_text(const unsigned char (&b)[16]) {
  char out[37];
  std::snprintf(out, sizeof(out), "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return out;
}

// "<bus id>/<uuid>" (no spaces: the cfg line is split on them), or
// unknown_gpu() when either part is empty.
inline std::string gpu_identity(const std::string& bus, const std::string& uuid) {
  if (bus.empty() || uuid.empty()) return unknown_gpu();
  return bus + "/" + uuid;
}

// The parts of an identity ("" for unknown_gpu()).
inline std::string gpu_bus(const std::string& id) {
  const size_t slash = id.find('/');
  return slash == std::string::npos ? "" : id.substr(0, slash);
}
inline std::string gpu_uuid(const std::string& id) {
  const size_t slash = id.find('/');
  return slash == std::string::npos ? "" : id.substr(slash + 1);
}

inline bool same_gpu(const std::string& a, const std::string& b) { return a != unknown_gpu() && a == b; }

// Two distinct GPUs behind one PCI bus id: MIG instances of one board.
inline bool sibling_mig_instances(const std::string& a, const std::string& b) {
  return a != unknown_gpu() && b != unknown_gpu() && a != b && gpu_bus(a) == gpu_bus(b);
}

struct GpuPlacement {
  bool group_shares_gpu = false;  // two ranks are on one GPU
  int ranks_on_my_gpu = 1;        // ranks on this rank's GPU, this one included
  // The most ranks on any one GPU, counting a rank whose GPU is unknown as
  // sharing with all: the fused grids must all be resident at once, so the
  // grid size errs on the small side.
  int most_on_a_gpu = 1;
};

// `gpus[q]`: rank q's gpu_identity(). `rank` indexes it.
inline GpuPlacement place_ranks(const std::vector<std::string>& gpus, int rank) {
  GpuPlacement p;
  const int n = int(gpus.size());
  for (int q = 0; q < n; ++q) {
    int on_q = 0;
    for (int r = 0; r < n; ++r) {
      if (q != r && same_gpu(gpus[size_t(q)], gpus[size_t(r)])) p.group_shares_gpu = true;
      if (gpus[size_t(q)] == unknown_gpu() || gpus[size_t(q)] == gpus[size_t(r)]) ++on_q;
    }
    p.most_on_a_gpu = std::max(p.most_on_a_gpu, on_q);
    if (q != rank && rank >= 0 && rank < n && same_gpu(gpus[size_t(q)], gpus[size_t(rank)])) ++p.ranks_on_my_gpu;
  }
  return p;
}

}  // namespace cuda_ipc
}  // namespace fastpar
