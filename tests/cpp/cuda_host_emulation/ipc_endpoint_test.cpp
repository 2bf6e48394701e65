// The lifetime of an IPC endpoint's pinned host words
// (transport/cuda_ipc/ipc_endpoint.cpp) against the fake runtime, whose
// pinned memory is heap memory: under AddressSanitizer a write after the
// free is fatal. Checked:
//   * after free_arena() (a shutdown), the host abort word and the status
//     mirror stay valid: abort() and Works reach them through the shared
//     endpoint on other threads, and a shutdown may run between their
//     load of the endpoint and their access;
//   * the destructor frees them exactly once;
//   * an abandoned arena whose device could not be synchronized keeps them
//     (a kernel may still read them);
//   * create() runs once per endpoint;
//   * threads raising the abort word and reading the status while another
//     thread disconnects and frees the arena, the endpoint kept alive only by
//     their shared_ptr copies, as CudaBackend::abort() and IpcWork hold it.
// Exit status 0 = every check passed.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "csrc/transport/cuda_ipc/ipc_endpoint.cpp"

namespace fastpar {
namespace cuda_ipc {
// Arenas in host memory: this test is about the endpoint, not the handles.
cudaError_t arena_alloc(size_t slot_bytes, size_t registered_bytes, void** base) {
  *base = std::calloc(1, arena_bytes(slot_bytes, registered_bytes));
  return *base ? cudaSuccess : cudaErrorInvalidValue;
}
cudaError_t arena_free(void* base) {
  std::free(base);
  return cudaSuccess;
}
cudaError_t export_handle(void* base, cudaIpcMemHandle_t* handle) {
  std::memcpy(handle->reserved, &base, sizeof base);
  return cudaSuccess;
}
cudaError_t open_handle(const cudaIpcMemHandle_t& handle, void** base) {
  std::memcpy(base, handle.reserved, sizeof *base);
  return cudaSuccess;
}
cudaError_t close_handle(void*) { return cudaSuccess; }
}  // namespace cuda_ipc
}  // namespace fastpar

using fastpar::cuda_ipc::IpcEndpoint;
namespace flags = fastpar::flags;

namespace {

int64_t checks = 0, failures = 0;

void check(bool ok, const char* what) {
  ++checks;
  if (!ok && ++failures <= 20) std::fprintf(stderr, "FAILED %s\n", what);
}

constexpr size_t kSlot = 4096;

void words_outlive_the_arena() {
  const int64_t before = fake_cuda::live_host_allocs;
  {
    IpcEndpoint ep;
    check(ep.create(0, 1, 0, kSlot) == cudaSuccess, "create");
    check(fake_cuda::live_host_allocs == before + 1, "create allocates one pinned block");
    check(ep.create(0, 1, 0, kSlot) == cudaErrorInvalidValue, "a second create is refused");
    check(ep.free_arena() == cudaSuccess, "free_arena");
    check(!ep.created(), "the arena is gone after free_arena");
    check(fake_cuda::live_host_allocs == before + 1, "free_arena keeps the host words");
    ep.raise_host_abort(uint32_t(flags::WaitStatus::kPeerAborted));
    check(ep.host_abort() == uint64_t(flags::WaitStatus::kPeerAborted), "the abort word is usable after free_arena");
    check(ep.host_status() == 0, "the status mirror is readable after free_arena");
    check(ep.create(0, 1, 0, kSlot) == cudaErrorInvalidValue, "no create after free_arena (the words would leak)");
  }
  check(fake_cuda::live_host_allocs == before, "the destructor frees the host words");
}

void broken_device_keeps_the_words() {
  const int64_t before = fake_cuda::live_host_allocs;
  // What the endpoint leaves to the driver, freed here once checked (the
  // fake's device view of pinned memory is the host address itself).
  std::vector<void*> arenas;
  void* words = nullptr;
  {
    IpcEndpoint ep;
    check(ep.create(0, 1, 0, kSlot) == cudaSuccess, "create");
    arenas.push_back(ep.comm().bases[0]);
    words = ep.comm().host_status;
    fake_cuda::sync_result = cudaErrorInvalidValue;  // the device cannot be synchronized
    ep.abandon_arena();
    check(!ep.created(), "the arena is forgotten");
    ep.raise_host_abort(uint32_t(flags::WaitStatus::kPeerDead));
    check(ep.host_abort() == uint64_t(flags::WaitStatus::kPeerDead), "the abort word is usable after abandon_arena");
  }
  check(fake_cuda::live_host_allocs == before + 1, "words a kernel may still read are never freed");
  fake_cuda::sync_result = cudaSuccess;
  cudaFreeHost(words);
  {
    IpcEndpoint ep;
    check(ep.create(0, 1, 0, kSlot) == cudaSuccess, "create");
    arenas.push_back(ep.comm().bases[0]);
    ep.abandon_arena();
  }
  check(fake_cuda::live_host_allocs == before, "an abandoned arena on an idle device frees the words");
  for (void* a : arenas) fastpar::cuda_ipc::arena_free(a);
}

// A backend's release (disconnect, free_arena, drop its reference) racing
// abort() and Works on other threads that each took their own reference.
void release_races_abort_and_works() {
  const int64_t before = fake_cuda::live_host_allocs;
  for (int round = 0; round < 200; ++round) {
    auto ep = std::make_shared<IpcEndpoint>();
    check(ep->create(0, 2, 0, kSlot) == cudaSuccess, "create");
    std::vector<cudaIpcMemHandle_t> handles(2);
    check(ep->export_handle(&handles[0]) == cudaSuccess, "export");
    handles[1] = handles[0];
    check(ep->connect(handles.data()) == cudaSuccess, "connect");
    std::atomic<bool> go{false};
    std::vector<std::thread> users;
    for (int t = 0; t < 3; ++t) {
      users.emplace_back([held = ep, &go, t] {
        while (!go.load()) std::this_thread::yield();
        for (int i = 0; i < 50; ++i) {
          if (t == 0) held->raise_host_abort(uint32_t(flags::WaitStatus::kPeerAborted));
          (void)held->host_status();
          (void)held->host_abort();
        }
      });
    }
    go = true;
    ep->disconnect();
    ep->free_arena();
    ep.reset();  // the users' copies are now the only owners
    for (auto& u : users) u.join();
  }
  check(fake_cuda::live_host_allocs == before, "every endpoint's words freed once its last user let go");
}

}  // namespace

int main() {
  words_outlive_the_arena();
  broken_device_keeps_the_words();
  release_races_abort_and_works();
  std::printf("%ld checks, %ld failures\n", long(checks), long(failures));
  return failures == 0 ? 0 : 1;
}
