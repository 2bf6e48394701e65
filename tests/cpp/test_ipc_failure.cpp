// The words of the CUDA IPC backend's failures and GPU-sharing state
// (csrc/core/transport/cuda_ipc/ipc_failure.h): which facts make a communicator
// failed, what the DistBackendError says (the op, this rank, the dead rank
// and its pid, the timeout, both calls of a mismatch), and the MPS note and warning decision.
#include <string>

#include "check.h"
#include "core/transport/cuda_ipc/ipc_failure.h"

using namespace fastpar;
using namespace fastpar::cuda_ipc;

static bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

static void status_words() {
  CHECK(std::string(wait_status_text(0)) == "ok");
  CHECK(has(wait_status_text(uint32_t(flags::WaitStatus::kTimeout)), "timed out"));
  CHECK(has(wait_status_text(uint32_t(flags::WaitStatus::kPeerAborted)), "aborted"));
  CHECK(has(wait_status_text(uint32_t(flags::WaitStatus::kPeerDead)), "died"));
  CHECK(has(wait_status_text(uint32_t(flags::WaitStatus::kMismatch)), "different call"));
  // send/recv match in order per pair (p2p_ring.h): the same status says so.
  CHECK(has(wait_status_text(uint32_t(flags::WaitStatus::kMismatch)), "different tag or size"));
  CHECK(has(wait_status_text(99), "unknown"));
}

static void failed_and_message() {
  FailureFacts f;
  CHECK(!failed(f));
  f.status = uint32_t(flags::WaitStatus::kMismatch);
  CHECK(failed(f));
  std::string m = failure_message("broadcast", 2, f, 5000);
  CHECK(has(m, "fastpar: broadcast over CUDA IPC failed on rank 2: peers are in a different call"));
  CHECK(has(m, "flag-wait timeout 5000 ms"));
  CHECK(has(m, "destroy the group"));
  // With the kernel's mismatch record: both calls, in the CPU path's words.
  f.mismatch_peer = 1;
  f.mine = CollCall{Coll::kBroadcast, 10, DType::F32, 0}.desc(7);
  f.theirs = CollCall{Coll::kAllreduce, 10, DType::BF16, -1, int(ReduceOp::SUM), kAuxFused}.desc(7);
  m = failure_message("broadcast", 2, f, 5000);
  CHECK(has(m, "collective mismatch: rank 2 called broadcast(count=10, dtype=float32, root=0) but rank 1 called "
               "allreduce(count=10, dtype=bfloat16, op=SUM, schedule=fused_one_shot)"));
  f.theirs = CollCall{Coll::kAllgather, 3, DType(kForeignDType + 11)}.desc(7);
  CHECK(has(failure_message("broadcast", 2, f, 5000), "rank 1 called allgather(count=3, dtype=torch#11)"));
  // registered_empty on one rank alone (it is collective): the allocation in bytes, not "count=..., dtype=uint8".
  f.mine = CollCall{Coll::kRegister, 1200000, DType::U8, -1, -1, 0}.desc(7);
  f.theirs = CollCall{Coll::kAllreduce, 300000, DType::F32, -1, int(ReduceOp::SUM), kAuxTwoShot}.desc(7);
  CHECK(has(failure_message("registered_empty", 0, f, 30000),
            "collective mismatch: rank 0 called registered_empty(bytes=1200000, offset=0) but rank 1 called "
            "allreduce(count=300000, dtype=float32, op=SUM, schedule=two_shot)"));
  f.mine = CollCall{Coll::kRegister, 64, DType::U8, -1, -1, kAuxNoFit}.desc(7);
  CHECK(has(failure_message("registered_empty", 0, f, 30000), "registered_empty(bytes=64, registered arena full)"));
  f.mismatch_peer = -1;
  // A dead peer is named whatever the status word says.
  f.status = uint32_t(flags::WaitStatus::kPeerAborted);
  f.dead_rank = 1;
  f.dead_pid = 4242;
  m = failure_message("all_reduce", 0, f, 1000);
  CHECK(has(m, "all_reduce over CUDA IPC failed on rank 0: rank 1 (pid 4242) exited"));
  FailureFacts dead_only;
  dead_only.dead_rank = 3;
  CHECK(failed(dead_only));
  FailureFacts aborted;
  aborted.aborted_here = true;
  CHECK(failed(aborted));
  CHECK(has(failure_message("reduce", 1, aborted, 10), "this rank's process group was aborted"));
  CHECK(!has(failure_message("reduce", 1, aborted, 10), "graph replay"));
  // A failed CUDA graph replay: the next call raises its status, naming the replay.
  FailureFacts replay;
  replay.status = replay.replay_status = uint32_t(flags::WaitStatus::kTimeout);
  m = failure_message("all_reduce", 1, replay, 10000);
  CHECK(has(m, "all_reduce over CUDA IPC failed on rank 1: timed out waiting for a peer's flag; a CUDA graph "
               "replay of all_reduce found it (timed out waiting for a peer's flag) and returned without reducing"));
  CHECK(has(m, "destroy the group"));
}

static void gpu_sharing() {
  CHECK(mps_from_attribute(false, 1) == Mps::kUnknown);
  CHECK(mps_from_attribute(true, 0) == Mps::kOff);
  CHECK(mps_from_attribute(true, 1) == Mps::kOn);
  CHECK(gpu_sharing_note(false, Mps::kOff).empty());
  CHECK(!sharing_warrants_warning(false, Mps::kOff));
  CHECK(has(gpu_sharing_note(true, Mps::kOn), "MPS on"));
  CHECK(!sharing_warrants_warning(true, Mps::kOn));
  CHECK(has(gpu_sharing_note(true, Mps::kOff), "time-slice"));
  CHECK(has(gpu_sharing_note(true, Mps::kOff), "nvidia-cuda-mps-control -d"));
  CHECK(sharing_warrants_warning(true, Mps::kOff));
  CHECK(has(gpu_sharing_note(true, Mps::kUnknown), "does not say"));
  CHECK(sharing_warrants_warning(true, Mps::kUnknown));
}

int main() {
  status_words();
  failed_and_message();
  gpu_sharing();
  return TEST_MAIN_RESULT();
}
