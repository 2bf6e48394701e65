// The CUDA backend's routing policy (csrc/torch/distributed/route.h): which
// call goes over CUDA IPC and which falls back to NCCL, and the parser of
// FASTPAR_CUDA_IPC_MAX_BYTES. Every rank evaluates this on equal inputs, so
// the policy being a pure function of them is what keeps ranks on one route.
#include <cstdint>
#include <string>

#include "check.h"
#include "torch/distributed/route.h"

using namespace fastpar::cuda_ipc;

// The route: IPC where ipc_refusal names no reason.
static bool ipc(const RouteQuery& q) { return *ipc_refusal(q) == '\0'; }

static RouteQuery eligible() {
  RouteQuery q;
  q.peer_access_agreed = true;
  q.nbytes = 4096;
  q.dtype_supported = true;
  q.op_supported = true;
  q.contiguous = true;
  q.on_rank_device = true;
  q.world_size = 2;
  q.max_ipc_bytes = kDefaultMaxIpcBytes;
  return q;
}

static void each_condition_is_required() {
  CHECK(ipc(eligible()));
  RouteQuery q = eligible();
  q.peer_access_agreed = false;
  CHECK(!ipc(q));
  q = eligible();
  q.dtype_supported = false;
  CHECK(!ipc(q));
  q = eligible();
  q.op_supported = false;
  CHECK(!ipc(q));
  q = eligible();
  q.contiguous = false;
  CHECK(!ipc(q));
  q = eligible();
  q.on_rank_device = false;
  CHECK(!ipc(q));
  CHECK(!ipc(RouteQuery{}));  // the default is never IPC
}

static void size_threshold_is_inclusive() {
  RouteQuery q = eligible();
  q.nbytes = 0;  // empty tensors stay on IPC: every rank skips the work the same way
  CHECK(ipc(q));
  q.nbytes = kDefaultMaxIpcBytes;
  CHECK(ipc(q));
  q.nbytes = kDefaultMaxIpcBytes + 1;
  CHECK(!ipc(q));
  q.nbytes = -1;
  CHECK(!ipc(q));
  q = eligible();
  q.max_ipc_bytes = 0;  // FASTPAR_CUDA_IPC_MAX_BYTES=0 turns IPC off, even for empty tensors
  q.nbytes = 0;
  CHECK(!ipc(q));
  q.max_ipc_bytes = int64_t(1) << 40;
  q.nbytes = int64_t(1) << 40;
  CHECK(ipc(q));
  CHECK(kDefaultMaxIpcBytes == 8 * 1024 * 1024);
}

static void world_size_limits() {
  RouteQuery q = eligible();
  for (int n = 1; n <= kMaxIpcRanks; ++n) {
    q.world_size = n;
    CHECK(ipc(q));
  }
  q.world_size = kMaxIpcRanks + 1;
  CHECK(!ipc(q));
  q.world_size = 0;
  CHECK(!ipc(q));
}

// Exhaustive over the boolean inputs: IPC exactly when all of them hold.
static void exhaustive_booleans() {
  for (int mask = 0; mask < 32; ++mask) {
    RouteQuery q = eligible();
    q.peer_access_agreed = mask & 1;
    q.dtype_supported = mask & 2;
    q.op_supported = mask & 4;
    q.contiguous = mask & 8;
    q.on_rank_device = mask & 16;
    CHECK(ipc(q) == (mask == 31));
  }
}

static void parser() {
  int64_t v = -7;
  CHECK(parse_byte_count("0", &v) && v == 0);
  CHECK(parse_byte_count("8388608", &v) && v == 8388608);
  CHECK(parse_byte_count("4611686018427387904", &v) && v == (int64_t(1) << 62));
  v = 5;
  CHECK(!parse_byte_count("4611686018427387905", &v) && v == 5);  // > 2^62: refused, out untouched
  CHECK(!parse_byte_count("99999999999999999999999", &v));
  CHECK(!parse_byte_count(nullptr, &v));
  CHECK(!parse_byte_count("", &v));
  CHECK(!parse_byte_count("-1", &v));
  CHECK(!parse_byte_count("+1", &v));
  CHECK(!parse_byte_count("8M", &v));
  CHECK(!parse_byte_count(" 1", &v));
  CHECK(!parse_byte_count("1.5", &v));
  CHECK(v == 5);
}

// Ranks sharing a GPU: NCCL cannot run, so the threshold (a choice between
// two working routes) no longer sends large calls away from IPC; every other
// condition still holds. ipc_refusal names the first failing condition.
static void shared_gpu_ignores_the_threshold_only() {
  RouteQuery q = eligible();
  q.fallback_usable = false;
  q.nbytes = kDefaultMaxIpcBytes * 16;
  CHECK(ipc(q));
  CHECK(std::string(ipc_refusal(q)).empty());
  q.fallback_usable = true;
  CHECK(!ipc(q));
  CHECK(std::string(ipc_refusal(q)) == "larger than FASTPAR_CUDA_IPC_MAX_BYTES");
  q = eligible();
  q.fallback_usable = false;
  q.max_ipc_bytes = 0;  // IPC off by the knob stays off
  CHECK(!ipc(q));
  CHECK(std::string(ipc_refusal(q)) == "FASTPAR_CUDA_IPC_MAX_BYTES=0");
  q = eligible();
  q.fallback_usable = false;
  q.contiguous = false;
  CHECK(!ipc(q));
  CHECK(std::string(ipc_refusal(q)) == "a tensor is not contiguous");
  q = eligible();
  q.peer_access_agreed = false;
  q.dtype_supported = false;
  CHECK(std::string(ipc_refusal(q)).find("not set up") != std::string::npos);  // the first condition wins
  q = eligible();
  q.op_supported = false;
  CHECK(std::string(ipc_refusal(q)).find("reduce op") != std::string::npos);
}

int main() {
  shared_gpu_ignores_the_threshold_only();
  each_condition_is_required();
  size_threshold_is_inclusive();
  world_size_limits();
  exhaustive_booleans();
  parser();
  return TEST_MAIN_RESULT();
}
