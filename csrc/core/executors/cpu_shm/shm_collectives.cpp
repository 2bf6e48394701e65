#include "shm_collectives.h"

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../algorithms/allreduce_slots.h"
#include "../../algorithms/copy_collectives_slots.h"
#include "../../algorithms/reduce_slots.h"
#include "../../kernels/cpu_reduce.h"
#include "../../transport/cpu_shm/host_memory.h"

namespace fastpar {
namespace cpu_shm {

namespace {

// The Reducer of the slot schedules on the CPU: the element math of
// cpu_reduce.h for one dtype and op, on the calling thread. `streaming`: the
// results go out with non-temporal stores (the far schedule, shm_placement.h).
template <typename T, ReduceOp OP>
struct CpuReducer {
  bool streaming;
  void operator()(const void* const* srcs, int nsrc, void* const* dsts, int ndst, int64_t count) const {
    const T* s[kMaxShmRanks];
    T* d[2];
    for (int i = 0; i < nsrc; ++i) s[i] = static_cast<const T*>(srcs[i]);
    for (int i = 0; i < ndst; ++i) d[i] = static_cast<T*>(dsts[i]);
    cpu_reduce_range<T, OP>(s, nsrc, d, ndst, 0, count, nsrc, streaming);
  }
};

// Runs `f(CpuReducer<T, OP>{streaming}, sizeof(T))` for runtime dt / op. A
// bitwise op on floats has no reducer: the front refuses it before any call starts.
template <class F>
void with_reducer(DType dt, ReduceOp op, F&& f, bool streaming = false) {
  bool ran = false;
  FASTPAR_DISPATCH_DTYPE(dt, [&] {
    FASTPAR_DISPATCH_CPU_OP(op, [&] {
      f(CpuReducer<scalar_t, kOp>{streaming}, int64_t(sizeof(scalar_t)));
      ran = true;
    });
  });
  if (!ran)
    throw std::invalid_argument(std::string("fastpar: no CPU reduction ") + op_name(op) + " for " + dtype_name(dt));
}

// One-shot up to this many bytes, two-shot above (-1 in ShmTuning: this
// default). One-shot moves (n+3)B per rank in 1 phase, two-shot about 4B in 2
// phases, so the crossover is where ~(n-1)B of extra traffic costs one flag
// round trip: 256 KiB for 2 ranks, as measured (docs/measurements.md). With
// more ranks the extra traffic grows with n and the crossover falls (the
// model gives ~32 KiB at 4 ranks).
int64_t default_one_shot_max(int n) { return n <= 2 ? 256 * 1024 : 32 * 1024; }

}  // namespace

// The zero-copy schedule for registered buffers saves the copy-in but not
// the traffic between cores, which bounds a 2-rank allreduce; below 16 MiB it
// measured slower than the copying schedule (docs/measurements.md): each rank
// writes lines its peer has just read, still in the peer's L2, where the
// copying schedule writes private memory and rotating slots. So it starts at
// 16 MiB; FASTPAR_SHM_REGISTERED_MIN_BYTES moves the line (0: always).
constexpr int64_t kRegisteredMinBytes = int64_t(16) << 20;

ShmTuning default_shm_tuning() { return ShmTuning{-1, AllreduceAlgo::kAuto, kRegisteredMinBytes}; }

namespace {
std::atomic<int64_t> registered_calls{0};
}  // namespace

int64_t registered_allreduce_calls() { return registered_calls.load(std::memory_order_relaxed); }

void allreduce(ShmComm& c, const ShmTuning& t, Placement& placement, const void* in, void* out, int64_t count,
               DType dt, ReduceOp op) {
  const int64_t bytes = count * dtype_size(dt);
  const int64_t reg = (in == out && bytes >= t.registered_min_bytes) ? c.arena_offset(in, bytes) : -1;
  const int64_t one_shot_max = t.one_shot_max_bytes >= 0 ? t.one_shot_max_bytes : default_one_shot_max(c.size());
  bool one_shot = bytes <= std::min(one_shot_max, c.slot_bytes());
  if (t.algo == AllreduceAlgo::kOneShot) one_shot = bytes <= c.slot_bytes();
  if (t.algo == AllreduceAlgo::kTwoShot) one_shot = false;
  // The algorithm is part of the descriptor (aux) so ranks that would pick
  // different schedules (different sizes, or registered on only some) fail
  // with a mismatch instead of mixing phase patterns.
  const int64_t aux = one_shot ? kAuxOneShot : (reg >= 0 ? reg : kAuxTwoShot);
  CollCall call{Coll::kAllreduce, count, dt, -1, int(op), aux};
  c.begin(Coll::kAllreduce, c.timeout());
  const char* i = static_cast<const char*>(in);
  char* o = static_cast<char*>(out);
  // Near or far, as the group measured for this schedule and size
  // (collective: may agree on the placement first).
  const PlacedSchedule sched =
      one_shot ? PlacedSchedule::kOneShot : reg >= 0 ? PlacedSchedule::kRegistered : PlacedSchedule::kTwoShot;
  const bool far = placement.choose(c, bytes, sched);
  StreamingSlots streaming(c);
  const uint64_t t0 = HostMemory::now_ns();
  with_reducer(
      dt, op,
      [&](auto reduce, int64_t es) {
        if (one_shot) {
          if (far) allreduce_one_shot(streaming, call, i, o, count, es, reduce);
          else allreduce_one_shot(c, call, i, o, count, es, reduce);
        } else if (reg >= 0 && !far) {
          registered_calls.fetch_add(1, std::memory_order_relaxed);
          allreduce_registered(c, call, reg, count, es, c.slot_bytes() / es, reduce);
        } else if (far) {  // a registered buffer's far form too (shm_placement.h)
          allreduce_two_shot(streaming, call, i, o, count, es, reduce);
        } else {
          allreduce_two_shot(c, call, i, o, count, es, reduce);
        }
      },
      far && !one_shot);  // the one-shot's results stay private: ordinary stores
  placement.record(HostMemory::now_ns() - t0);
}

void reduce(ShmComm& c, const void* in, void* out, int64_t count, DType dt, ReduceOp op, int root) {
  CollCall call{Coll::kReduce, count, dt, root, int(op)};
  c.begin(Coll::kReduce, c.timeout());
  with_reducer(dt, op, [&](auto reduce, int64_t es) {
    reduce_slots(c, call, static_cast<const char*>(in), static_cast<char*>(out), count, es, root, reduce);
  });
}

void reduce_scatter(ShmComm& c, const void* in, void* out, int64_t count, DType dt, ReduceOp op) {
  CollCall call{Coll::kReduceScatter, count, dt, -1, int(op)};
  c.begin(Coll::kReduceScatter, c.timeout());
  const int64_t es = dtype_size(dt);
  std::vector<const char*> blocks(size_t(c.size()));
  for (int q = 0; q < c.size(); ++q) blocks[q] = static_cast<const char*>(in) + q * count * es;
  with_reducer(dt, op, [&](auto reduce, int64_t) {
    reduce_scatter_blocks(c, call, blocks.data(), static_cast<char*>(out), count, es, reduce);
  });
}

void broadcast(ShmComm& c, void* data, int64_t count, DType dt, int root) {
  c.begin(Coll::kBroadcast, c.timeout());
  broadcast_slots(c, CollCall{Coll::kBroadcast, count, dt, root}, static_cast<char*>(data),
                count * dtype_size(dt), root);
}

void gather(ShmComm& c, const void* in, void* const* outs, int64_t count, DType dt, int root) {
  const Coll op = root < 0 ? Coll::kAllgather : Coll::kGather;
  c.begin(op, c.timeout());
  std::vector<char*> o(size_t(c.size()));
  for (int q = 0; q < c.size(); ++q) o[q] = static_cast<char*>(outs ? outs[q] : nullptr);
  gather_slots(c, CollCall{op, count, dt, root}, static_cast<const char*>(in), o.data(), count * dtype_size(dt), root);
}

void scatter(ShmComm& c, const void* const* ins, void* out, int64_t count, DType dt, int root) {
  c.begin(Coll::kScatter, c.timeout());
  std::vector<const char*> i(size_t(c.size()));
  for (int q = 0; q < c.size(); ++q) i[q] = static_cast<const char*>(ins ? ins[q] : nullptr);
  scatter_slots(c, CollCall{Coll::kScatter, count, dt, root}, i.data(), static_cast<char*>(out),
              count * dtype_size(dt), root);
}

void alltoall(ShmComm& c, const void* in, const int64_t* in_off, const int64_t* in_count, void* out,
              const int64_t* out_off, const int64_t* out_count, DType dt) {
  c.begin(Coll::kAlltoall, c.timeout());
  const int n = c.size();
  const int64_t es = dtype_size(dt);
  std::vector<int64_t> io(n), ib(n), oo(n), ob(n);
  for (int q = 0; q < n; ++q) {
    io[q] = in_off[q] * es;
    ib[q] = in_count[q] * es;
    oo[q] = out_off[q] * es;
    ob[q] = out_count[q] * es;
  }
  alltoall_slots(c, CollCall{Coll::kAlltoall, -1, dt}, static_cast<const char*>(in), io.data(), ib.data(),
               static_cast<char*>(out), oo.data(), ob.data());
}

void barrier(ShmComm& c) {
  c.begin(Coll::kBarrier, c.timeout());
  barrier_slots(c, CollCall{Coll::kBarrier, 0, DType::U8});
}

int64_t register_alloc(ShmComm& c, int64_t bytes) {
  c.begin(Coll::kRegister, c.timeout());
  // Every rank allocates (the same bookkeeping called in the same order gives
  // the same offset) and reserves the block's pages in /dev/shm; then every
  // rank learns every rank's outcome, so that all return the buffer or all
  // raise, and the communicator stays usable when some rank had no room.
  constexpr int64_t kArenaFull = -1, kShmFull = -2;
  int64_t off = c.arena_alloc(bytes);
  std::string why;
  const std::string arena_full = std::to_string(bytes) + " bytes do not fit in the registered arena of " +
                                 std::to_string(c.arena_bytes()) + " bytes (raise FASTPAR_SHM_REGISTERED_BYTES)";
  if (off < 0) {
    off = kArenaFull;
    why = arena_full;
  } else if (!(why = c.arena_reserve(off, RegisteredArena::block_bytes(bytes))).empty()) {
    c.arena_free(off);
    off = kShmFull;
  }
  const int n = c.size();
  std::vector<int64_t> got;
  try {
    // count = bytes: ranks asking for different sizes fail as a mismatch.
    got = allgather_value(c, CollCall{Coll::kRegister, bytes, DType::U8}, off);
  } catch (...) {
    if (off >= 0) c.arena_free(off);
    throw;
  }
  const std::string me = "fastpar: registered_empty on rank " + std::to_string(c.global_rank(c.rank())) + ": ";
  std::string others;
  bool some_shm = false, some_arena = false;
  for (int q = 0; q < n; ++q) {
    if (got[q] >= 0 || q == c.rank()) continue;
    others += (others.empty() ? "" : ", ") + std::to_string(c.global_rank(q));
    (got[q] == kShmFull ? some_shm : some_arena) = true;
  }
  if (off < 0 || !others.empty()) {
    if (off >= 0) c.arena_free(off);
    std::string msg = me + (off < 0 ? why + "; " : std::string());
    if (!others.empty())
      msg += "rank(s) " + others + (off < 0 ? " had no room either: " : " had no room: ") +
             (some_arena ? arena_full : std::string()) + (some_arena && some_shm ? ", or " : "") +
             (some_shm ? std::to_string(bytes) + " bytes do not fit in /dev/shm (see their error)" : std::string()) +
             "; ";
    throw std::invalid_argument(msg + "no rank allocated it");
  }
  for (int q = 0; q < n; ++q)
    if (got[q] != off) {
      c.arena_free(off);
      c.fail(me + "rank " + std::to_string(c.global_rank(q)) + " allocated its buffer at offset " +
             std::to_string(got[q]) + " of its registered arena but this rank at " + std::to_string(off) +
             ": ranks must allocate and free registered tensors in the same order");
    }
  return off;
}

}  // namespace cpu_shm
}  // namespace fastpar
