// The core's CPU allreduce without torch, 2 ranks in forked processes (one
// CPU each), beside what bounds it: a local copy of the same bytes, and the
// crossing alone (each rank publishes B/2 into its slots with the form's
// stores, one phase, copies the peer's B/2 out; twice: the bytes a two-shot
// moves between the cores, without the reduction). float32 SUM; us per call,
// the slower rank's best of 7 blocks.
//   g++ -O3 -std=c++17 -I csrc benchmarks/shm_core_bench.cpp -o /tmp/shm_core_bench -lpthread
//   /tmp/shm_core_bench 1048576 far 262144 524288 1048576   # slot bytes, near|far|auto, sizes
#include "core/transport/cpu_shm/shm_segment.cpp"
#include "core/transport/cpu_shm/shm_comm.cpp"
#include "core/executors/cpu_shm/shm_placement.cpp"
#include "core/executors/cpu_shm/shm_collectives.cpp"
#include <sched.h>
#include <sys/wait.h>
#include <fstream>
#include <sstream>
#include <chrono>
#include <thread>
using namespace fastpar;
using namespace fastpar::cpu_shm;
static std::string dir;
static std::string fn(std::string k) { for (auto& ch : k) if (ch == '/') ch = '_'; return dir + "/" + k; }
static double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main(int argc, char** argv) {
  int64_t slot = atoll(argv[1]);
  std::string place = argv[2];
  std::vector<int64_t> sizes;
  for (int i = 3; i < argc; ++i) sizes.push_back(atoll(argv[i]));
  char tmpl[] = "/tmp/shmbenchXXXXXX";
  dir = mkdtemp(tmpl);
  pid_t kids[2];
  for (int r = 0; r < 2; ++r) {
    kids[r] = fork();
    if (kids[r] == 0) {
      cpu_set_t s; CPU_ZERO(&s); CPU_SET(r, &s); sched_setaffinity(0, sizeof(s), &s);
      Rendezvous rv;
      rv.set = [](const std::string& k, const std::string& v) { { std::ofstream(fn(k) + ".tmp") << v; } rename((fn(k) + ".tmp").c_str(), fn(k).c_str()); };
      rv.get = [](const std::string& k) { std::ifstream f(fn(k)); std::stringstream ss; ss << f.rdbuf(); return ss.str(); };
      rv.check = [](const std::string& k) { return access(fn(k).c_str(), F_OK) == 0; };
      ShmOptions o = default_shm_options(std::chrono::milliseconds(60000));
      o.slot_bytes = slot;
      ShmComm c(r, 2, {0, 1}, rv, o);
      Placement pl(place == "far" ? PlacementMode::kFar : place == "auto" ? PlacementMode::kAuto : PlacementMode::kNear);
      ShmTuning t = default_shm_tuning();
      std::ostringstream out;
      for (int64_t b : sizes) {
        std::vector<float> x(b / 4, 1.0f), y(b / 4);
        int iters = std::max<int64_t>(20, std::min<int64_t>(2000, (int64_t(64) << 20) / b));
        for (int i = 0; i < (place == "auto" ? 200 : 20); ++i) allreduce(c, t, pl, x.data(), x.data(), b / 4, DType::F32, ReduceOp::SUM);
        double best = 1e9, bestc = 1e9;
        for (int blk = 0; blk < 7; ++blk) {
          allreduce(c, t, pl, x.data(), y.data(), 1, DType::F32, ReduceOp::SUM);  // sync
          double t0 = now_s();
          for (int i = 0; i < iters; ++i) allreduce(c, t, pl, x.data(), x.data(), b / 4, DType::F32, ReduceOp::SUM);
          best = std::min(best, (now_s() - t0) / iters);
          allreduce(c, t, pl, x.data(), y.data(), 1, DType::F32, ReduceOp::SUM);
          t0 = now_s();
          for (int i = 0; i < iters; ++i) { memcpy(y.data(), x.data(), b); asm volatile("" ::: "memory"); }
          bestc = std::min(bestc, (now_s() - t0) / iters);
        }
        // the crossing alone: publish B/2 into a rotating slot (the form's stores), one phase, copy the peer's B/2 out; twice
        double bestx = 1e9;
        const int64_t h = std::min<int64_t>(b / 2, c.slot_bytes());
        for (int blk = 0; blk < 7; ++blk) {
          allreduce(c, t, pl, x.data(), y.data(), 1, DType::F32, ReduceOp::SUM);
          double t0 = now_s();
          for (int i = 0; i < iters; ++i) {
            for (int rep = 0; rep < 2; ++rep) {
              int k = c.next_round();
              for (int64_t off = 0; off < b / 2; off += h) {
                if (place == "far") stream_copy(c.slot(r, k), (const char*)x.data() + off, h); else memcpy(c.slot(r, k), (const char*)x.data() + off, h);
                c.phase(CollCall{Coll::kAllreduce, 7, DType::F32, -1, 0, 0});
                memcpy((char*)y.data() + off, c.slot(1 - r, k), h);
                if (off + h < b / 2) k = c.next_round();
              }
            }
          }
          bestx = std::min(bestx, (now_s() - t0) / iters);
        }
        out << b << " " << best * 1e6 << " " << bestc * 1e6 << " " << bestx * 1e6 << "\n";
      }
      std::ofstream(dir + "/res" + std::to_string(r)) << out.str();
      _exit(0);
    }
  }
  int st; waitpid(kids[0], &st, 0); waitpid(kids[1], &st, 0);
  std::ifstream f0(dir + "/res0"), f1(dir + "/res1");
  int64_t b; double a0, c0, a1, c1, x0, x1;
  while (f0 >> b >> a0 >> c0 >> x0 && f1 >> b >> a1 >> c1 >> x1)
    printf("slot %7lld %s size %8lld  allreduce %9.1f us  copy %8.1f us  crossing %8.1f us\n", (long long)slot, place.c_str(), (long long)b, std::max(a0, a1), std::max(c0, c1), std::max(x0, x1));
  return 0;
}
