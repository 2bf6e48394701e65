// The fused two-shot all_reduce kernel (core/executors/cuda_ipc/ipc_fused_two_shot.h)
// on the host: one thread per rank, every block of a launch on a thread of its
// own (emulated_ipc.h), the kernel's own block body (two_shot_block) over
// host atomics. Checked:
//   * bit for bit equal to the step-by-step two-shot (fused_two_shot = false,
//     the schedule of allreduce_slots.h) for 2, 3, 4 and 5 ranks (both rank
//     bounds of the kernel), every dtype and reduce op the kernels have,
//     sizes 0, 1, odd, below one block's share, one chunk and several chunks
//     with a short last one (a 256-byte slot), in and out of place, aligned
//     and at an odd element offset (the scalar path), all in one long
//     sequence per communicator (slot rotation, block counts changing
//     between calls, one-shot calls in between);
//   * one launch per call, whatever the size, and the phase numbering of the
//     step-by-step schedule (m chunks: m + 1 phases, m slot rounds), so the
//     phase kernel's calls that follow stay in step;
//   * failures as the phase kernel's: a peer in the step-by-step two-shot or
//     in another call fails with kMismatch (record names schedule
//     fused_two_shot) or kPeerAborted on every rank; a peer that never comes
//     ends the wait at the timeout; the host abort word (a 60 s timeout) ends
//     it at once with its code; a
//     later call on a failed communicator writes nothing; status word =
//     host mirror;
//   * the grid cap (ipc_comm.h, fused_grid_blocks) and the block counts it bounds
//     (the two-shot's, the collectives', the one-shot's);
//   * the bits and the failures in both forms of the block barriers
//     (ipc_arena.h, FlagForm).
// Exit status 0 = every check passed.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "emulated_checks.h"
#include "emulated_ipc.h"

#include "csrc/core/executors/cuda_ipc/ipc_allreduce.cpp"

using namespace fastpar;

namespace {

using emulated::Arenas;
using emulated::comm_for;

constexpr size_t kSlot = 256;

struct Case {
  DType dt;
  ReduceOp op;
  int64_t count;
  bool in_place;
  int offset;  // elements: 0 aligned, 1 the scalar path
};

std::vector<Case> cases() {
  std::vector<Case> out;
  const int64_t sizes[] = {0, 1, 7, 37, 64, 255, 700, 1031};
  int i = 0;
  for (int d = 0; d <= int(DType::I64); ++d)
    for (int o = 0; o <= int(ReduceOp::MAX); ++o)
      for (int64_t n : sizes) {
        ++i;
        out.push_back({DType(d), ReduceOp(o), n, i % 3 == 0, i % 5 == 0 ? 1 : 0});
      }
  return out;
}

// Small values whose products and sums stay exact in every dtype: bitwise
// equality then tests the order and math, not luck with rounding.
void fill(DType dt, void* p, int64_t count, int rank, int call) {
  FASTPAR_DISPATCH_DTYPE(dt, [&] {
    scalar_t* x = static_cast<scalar_t*>(p);
    for (int64_t i = 0; i < count; ++i) {
      const int v = int((rank * 7 + call * 3 + i * 5) % 5) - 1 + (rank == 1 && i % 7 == 0 ? 2 : 0);
      using A = acc_t<scalar_t>;
      const A a = !std::is_integral_v<scalar_t> ? A(float(v) * 0.75f) : A(std::is_unsigned_v<scalar_t> ? v + 1 : v);
      x[i] = store_acc<scalar_t>(a);
    }
  });
}

// Every rank runs the whole sequence of `cs` with the schedule `fused`;
// outs[r][i] is rank r's output bytes of call i. One-shot calls in between
// (every fourth) keep the slots and phases turning as in real use.
void run_sequence(int n, bool fused, const std::vector<Case>& cs, std::vector<std::vector<std::vector<char>>>& outs,
                  std::vector<int64_t>& launches_per_call) {
  Arenas arenas(n, kSlot);
  outs.assign(size_t(n), std::vector<std::vector<char>>(cs.size()));
  launches_per_call.assign(cs.size(), -1);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      cuda_ipc::IpcComm c = comm_for(arenas, r, kSlot);
      c.fused_two_shot = fused;
      for (size_t i = 0; i < cs.size(); ++i) {
        const Case& k = cs[i];
        const int64_t es = dtype_size(k.dt);
        std::vector<uint4> in_store(size_t((k.count + 1) * es / 16 + 2)), out_store(in_store.size());
        char* in = reinterpret_cast<char*>(in_store.data()) + k.offset * es;
        char* out = k.in_place ? in : reinterpret_cast<char*>(out_store.data()) + k.offset * es;
        fill(k.dt, in, k.count, r, int(i));
        const uint64_t seq0 = c.seq, rounds0 = c.rounds;
        const int64_t launches0 = fake_cuda::stream_ops.launches;
        expect(cuda_ipc::allreduce_two_shot(c, k.dt, k.op, in, out, k.count, nullptr) == cudaSuccess,
               "two-shot enqueued");
        if (r == 0) launches_per_call[i] = fake_cuda::stream_ops.launches - launches0;
        const int64_t m = std::max<int64_t>(1, (k.count + int64_t(kSlot) / es - 1) / (int64_t(kSlot) / es));
        expect(c.seq == seq0 + uint64_t(m) + 1 && c.rounds == rounds0 + uint64_t(m),
               "m chunks take m + 1 phases and m slot rounds");
        outs[size_t(r)][i].assign(out, out + k.count * es);
        if (i % 4 == 3) {  // a one-shot call in between
          std::vector<float> x(9, float(r)), y(9);
          cuda_ipc::allreduce_one_shot(c, DType::F32, ReduceOp::SUM, x.data(), y.data(), 9, nullptr);
          expect(y[8] == float(n * (n - 1) / 2), "the one-shot in between");
        }
      }
      uint32_t st = 0;
      cuda_ipc::read_status(c, nullptr, &st);
      expect(st == 0, "no failure in the sequence");
    });
  for (auto& t : threads) t.join();
}

void check_bits(int n) {
  const std::vector<Case> cs = cases();
  std::vector<std::vector<std::vector<char>>> fused, steps;
  std::vector<int64_t> fused_launches, step_launches;
  run_sequence(n, true, cs, fused, fused_launches);
  run_sequence(n, false, cs, steps, step_launches);
  char what[200];
  for (size_t i = 0; i < cs.size(); ++i) {
    const Case& k = cs[i];
    for (int r = 0; r < n; ++r) {
      std::snprintf(what, sizeof(what), "n=%d rank %d call %zu: %s %s count %ld %s offset %d: fused == step-by-step",
                    n, r, i, dtype_name(k.dt), op_name(k.op), long(k.count), k.in_place ? "in place" : "out of place",
                    k.offset);
      expect(fused[size_t(r)][i] == steps[size_t(r)][i], what);
      std::snprintf(what, sizeof(what), "n=%d rank %d call %zu: every rank has rank 0's bits", n, r, i);
      expect(fused[size_t(r)][i] == fused[0][i], what);
    }
    std::snprintf(what, sizeof(what), "n=%d call %zu (count %ld): one launch, got %ld", n, i, long(k.count),
                  long(fused_launches[i]));
    expect(fused_launches[i] == 1, what);
  }
}

enum class Peer { kStepByStep, kOtherCount, kAbsent, kHostAbort };

// Rank 0 runs the fused two-shot; the others do what `peer` says. Every rank
// must come back with a failure (never hang), rank 0 with the expected one,
// and write nothing in a later call.
void check_failure(int n, Peer peer) {
  Arenas arenas(n, kSlot);
  std::vector<uint32_t> status(size_t(n), 0), mirror(size_t(n), 0);
  std::vector<cuda_ipc::MismatchRecord> record(size_t(n), cuda_ipc::MismatchRecord{});
  std::vector<int> untouched(size_t(n), 0);
  std::vector<uint64_t> host_abort(size_t(n), 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      cuda_ipc::IpcComm c = comm_for(arenas, r, kSlot);
      c.timeout_ns = uint64_t(peer == Peer::kAbsent ? 300 : 60000) * 1000 * 1000;
      c.host_status = &mirror[size_t(r)];
      c.host_mismatch = &record[size_t(r)];
      c.host_abort = &host_abort[size_t(r)];
      std::vector<float> in(300, 1.0f), out(300, -7.0f);
      // The peer watcher found a dead peer: rank 0's waits end at once.
      if (r == 0 && peer == Peer::kHostAbort) cuda_ipc::raise_abort_word(&host_abort[0], 3);
      if (r == 0) {
        cuda_ipc::allreduce_two_shot(c, DType::F32, ReduceOp::SUM, in.data(), out.data(), 300, nullptr);
      } else if (peer == Peer::kStepByStep) {
        c.fused_two_shot = false;
        cuda_ipc::allreduce_two_shot(c, DType::F32, ReduceOp::SUM, in.data(), out.data(), 300, nullptr);
      } else if (peer == Peer::kOtherCount) {
        cuda_ipc::allreduce_two_shot(c, DType::F32, ReduceOp::SUM, in.data(), out.data(), 299, nullptr);
      }
      if ((peer == Peer::kAbsent || peer == Peer::kHostAbort) && r != 0) return;  // never comes
      std::vector<float> out2(300, -7.0f);
      cuda_ipc::allreduce_two_shot(c, DType::F32, ReduceOp::SUM, in.data(), out2.data(), 300, nullptr);
      cuda_ipc::read_status(c, nullptr, &status[size_t(r)]);
      untouched[size_t(r)] = std::all_of(out2.begin(), out2.end(), [](float v) { return v == -7.0f; });
    });
  for (auto& t : threads) t.join();
  char what[200];
  const char* name[] = {"step-by-step peer", "other count", "absent peer", "host abort"};
  if (peer == Peer::kStepByStep || peer == Peer::kOtherCount) {
    std::snprintf(what, sizeof(what), "%s n=%d: some rank saw the mismatch", name[int(peer)], n);
    expect(std::any_of(status.begin(), status.end(),
                       [](auto v) { return flags::WaitStatus(v) == flags::WaitStatus::kMismatch; }),
           what);
  }
  for (int r = 0; r < n; ++r) {
    if ((peer == Peer::kAbsent || peer == Peer::kHostAbort) && r != 0) continue;
    const auto s = flags::WaitStatus(status[size_t(r)]);
    std::snprintf(what, sizeof(what), "%s n=%d: rank %d ended with status %u", name[int(peer)], n, r, unsigned(s));
    switch (peer) {
      case Peer::kStepByStep:
      case Peer::kOtherCount:
        // A rank sees the mismatch itself or the abort of a peer that saw it
        // first (which, with 3 or more ranks, may be rank 0's lot): a race
        // every outcome of which is right, as long as someone saw it (below).
        expect(s == flags::WaitStatus::kMismatch || s == flags::WaitStatus::kPeerAborted, what);
        break;
      case Peer::kAbsent: expect(s == flags::WaitStatus::kTimeout, what); break;
      case Peer::kHostAbort: expect(s == flags::WaitStatus::kPeerDead, what); break;
    }
    std::snprintf(what, sizeof(what), "%s n=%d: rank %d wrote a call's output after failing", name[int(peer)], n, r);
    expect(untouched[size_t(r)] != 0, what);
    std::snprintf(what, sizeof(what), "%s n=%d: rank %d mirror %u != status %u", name[int(peer)], n, r,
                  mirror[size_t(r)], status[size_t(r)]);
    expect(mirror[size_t(r)] == status[size_t(r)], what);
    if (s == flags::WaitStatus::kMismatch) {
      const cuda_ipc::MismatchRecord& m = record[size_t(r)];
      std::snprintf(what, sizeof(what), "%s n=%d: rank %d records its fused two-shot and a different call",
                    name[int(peer)], n, r);
      const bool mine_fused = r == 0 || peer == Peer::kOtherCount;
      expect(m.peer_plus_one > 0 && !flags::same_call(m.mine, m.theirs) &&
                 m.mine.aux == (mine_fused ? emulated::fused_aux(kAuxFusedTwoShot) : kAuxTwoShot),
             what);
      if (mine_fused)
        expect(describe(m.mine).find("schedule=fused_two_shot") != std::string::npos, "the record names the schedule");
    }
  }
}

}  // namespace

// The grid cap: every rank's grid on a GPU resident at once, from the fewest
// SMs and the most ranks on one GPU, never past the arena's block flags.
#define EXPECT(cond) expect((cond), #cond)
void check_grid_cap() {
  using cuda_ipc::fused_grid_blocks;
  using cuda_ipc::kTwoShotMaxBlocks;
  EXPECT(fused_grid_blocks(132, 1) == kTwoShotMaxBlocks);  // an H100 alone: the flags bound
  EXPECT(fused_grid_blocks(120, 2) == 59);                 // 2 ranks, 120 SMs: 2 left over, not 60 + 60
  EXPECT(fused_grid_blocks(140, 2) == 64);                 // 128 flags bound 140 - 2 SMs
  EXPECT(fused_grid_blocks(108, 2) == 53);                 // 2 ranks on an A100: 106 SMs, not 128
  EXPECT(fused_grid_blocks(132, 4) == 32);
  EXPECT(fused_grid_blocks(2, 1) == 1);                     // never below one block
  EXPECT(fused_grid_blocks(0, 3) == kTwoShotMaxBlocks / 3);  // SMs unknown: as before
  EXPECT(fused_grid_blocks(8, 16) == 1);                     // never below one block
  cuda_ipc::IpcComm c{};
  c.size = 4;
  EXPECT(cuda_ipc::fused_grid_cap(c) == kTwoShotMaxBlocks / 4);  // not set up: as before
  c.fused_grid_blocks = fused_grid_blocks(108, 4);
  const int cap = cuda_ipc::fused_grid_cap(c);
  EXPECT(cap == 26);
  EXPECT(cuda_ipc::two_shot_blocks(int64_t(1) << 30, 4, 4, int64_t(1) << 21, 16 * 1024, cap) == 26);
  EXPECT(cuda_ipc::fused_coll_blocks(int64_t(1) << 30, int64_t(1) << 23, 16 * 1024, cap) == 26);
  EXPECT(cuda_ipc::two_shot_blocks(1000, 4, 4, int64_t(1) << 21, 16 * 1024, cap) == 1);  // small calls: unchanged
  // The one-shot (one block per SM too): kFusedMaxBlocks unless the cap is lower.
  EXPECT(cuda_ipc::fused_one_shot_blocks(int64_t(1) << 20, 16 * 1024, cap) == cuda_ipc::kFusedMaxBlocks);
  EXPECT(cuda_ipc::fused_one_shot_blocks(int64_t(1) << 20, 16 * 1024, fused_grid_blocks(108, 8)) == 13);
  EXPECT(cuda_ipc::fused_one_shot_blocks(int64_t(1) << 20, 16 * 1024, fused_grid_blocks(132, 8)) == 16);
  EXPECT(cuda_ipc::fused_one_shot_blocks(40000, 16 * 1024, fused_grid_blocks(108, 8)) == 3);
  EXPECT(cuda_ipc::fused_one_shot_blocks(1, 16 * 1024, 0) == 1);
}
#undef EXPECT

int main() {
  check_grid_cap();
  for (cuda_ipc::FlagForm form : emulated::kFlagForms) {
    emulated::g_flag_form = form;
    std::fprintf(stderr, "checks with %s\n", emulated::flag_form_name(form));
    for (int n = 2; n <= 8; ++n) check_bits(n);
    for (int n = 2; n <= 4; ++n)
      for (Peer p : {Peer::kStepByStep, Peer::kOtherCount, Peer::kAbsent, Peer::kHostAbort}) check_failure(n, p);
  }
  std::printf("%ld checks, %ld failures\n", long(checks.load()), long(failures.load()));
  return failures == 0 ? 0 : 1;
}
