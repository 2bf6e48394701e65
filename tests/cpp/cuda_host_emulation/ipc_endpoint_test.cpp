// The lifetime of an IPC endpoint's pinned host words
// (core/transport/cuda_ipc/ipc_endpoint.cpp) against the fake runtime, whose
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
//     their shared_ptr copies, as CudaEngine::abort() and IpcWork hold it;
//   * the destructor never frees an arena whose handle was exported (peers
//     may still map it: a CudaIpcComm dropped without close(), a setup
//     unwinding an exception); only free_arena() does, or a never-exported
//     arena's destructor;
//   * a call that could not be enqueued (ipc_steps.h, fail_enqueue) raises
//     the endpoint's own host abort word and its control block's abort word,
//     and fails the communicator for later calls, with words naming the error;
//   * the endpoint's calls on cuda:3 from a thread that never chose a device
//     make no context on cuda:0 (DeviceRestore, cuda_p2p/cuda_try.h), and a
//     device the thread did choose is restored.
// Exit status 0 = every check passed.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "csrc/core/transport/cuda_ipc/ipc_endpoint.cpp"
#include "csrc/core/executors/cuda_ipc/ipc_steps.h"

namespace fastpar {
namespace cuda_ipc {
// Arenas in host memory: this test is about the endpoint, not the handles.
// Counted, as the fake runtime counts pinned blocks.
std::atomic<int64_t> live_arenas{0};
cudaError_t arena_alloc(size_t slot_bytes, size_t registered_bytes, void** base) {
  *base = std::calloc(1, arena_bytes(slot_bytes, registered_bytes));
  if (*base) ++live_arenas;
  return *base ? cudaSuccess : cudaErrorInvalidValue;
}
cudaError_t arena_free(void* base) {
  std::free(base);
  --live_arenas;
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

using fastpar::cuda_ipc::live_arenas;

// An endpoint of a 2-rank group whose peer is itself: exported and connected.
void connect_to_self(IpcEndpoint& ep, int device) {
  check(ep.create(0, 2, device, kSlot) == cudaSuccess, "create");
  std::vector<cudaIpcMemHandle_t> handles(2);
  check(ep.export_handle(&handles[0]) == cudaSuccess, "export");
  handles[1] = handles[0];
  check(ep.connect(handles.data()) == cudaSuccess, "connect");
}

void destructor_frees_no_exported_arena() {
  const int64_t words_before = fake_cuda::live_host_allocs, arenas_before = live_arenas;
  void* abandoned = nullptr;
  {
    IpcEndpoint ep;  // as a CudaIpcComm dropped without close(), or a rendezvous unwinding
    connect_to_self(ep, 0);
    abandoned = ep.comm().bases[0];
  }
  check(live_arenas == arenas_before + 1, "the destructor leaves an exported arena allocated");
  check(fake_cuda::live_host_allocs == words_before, "the destructor still frees the host words (device idle)");
  fastpar::cuda_ipc::arena_free(abandoned);  // what the driver does at exit
  {
    IpcEndpoint ep;
    connect_to_self(ep, 0);
    check(ep.disconnect() == cudaSuccess && ep.free_arena() == cudaSuccess, "disconnect, free_arena");
    check(live_arenas == arenas_before, "free_arena (after the closing barrier) frees the arena");
  }
  {
    IpcEndpoint ep;
    check(ep.create(0, 2, 0, kSlot) == cudaSuccess, "create");
    check(live_arenas == arenas_before + 1, "create allocates the arena");
  }
  check(live_arenas == arenas_before, "an arena whose handle never left the process is freed by the destructor");
  check(fake_cuda::live_host_allocs == words_before, "every endpoint's words freed");
}

void enqueue_failure_fails_the_endpoint() {
  namespace ipc = fastpar::cuda_ipc;
  IpcEndpoint ep;
  check(ep.create(0, 1, 0, kSlot) == cudaSuccess, "create");
  ipc::IpcComm& c = ep.comm();
  check(ipc::ipc_steps::check_comm(c) == cudaSuccess && ep.enqueue_error() == cudaSuccess, "healthy at first");
  check(ipc::ipc_steps::fail_enqueue(c, cudaErrorLaunchOutOfResources, nullptr) == cudaErrorLaunchOutOfResources,
        "fail_enqueue returns the error");
  check(ep.host_abort() == uint64_t(flags::WaitStatus::kPeerAborted), "the endpoint's host abort word is raised");
  check(__atomic_load_n(&ipc::control_of(c.bases[0])->abort, __ATOMIC_ACQUIRE) != 0,
        "the control block's abort word is written (peers' waits end)");
  check(ep.enqueue_error() == cudaErrorLaunchOutOfResources &&
            ipc::ipc_steps::check_comm(c) == cudaErrorLaunchOutOfResources,
        "later calls are refused with the error");
  ipc::ipc_steps::fail_enqueue(c, cudaErrorInvalidValue, nullptr);
  check(ep.enqueue_error() == cudaErrorLaunchOutOfResources, "the first error stays");
  const std::string m = ipc::enqueue_failure_message("all_reduce", 0, ep.enqueue_error(), true);
  check(m.find("all_reduce") != std::string::npos && m.find("an earlier call") != std::string::npos &&
            m.find("too many resources requested for launch") != std::string::npos,
        "the message names the op and the CUDA error");
  check(ep.free_arena() == cudaSuccess, "free_arena");
}

// Each case on a fresh thread, whose current device is the default 0.
void restores_no_device_it_would_create() {
  fake_cuda::primary_contexts = 0;
  std::thread([] {
    {
      IpcEndpoint ep;
      connect_to_self(ep, 3);
      check(ep.disconnect() == cudaSuccess && ep.free_arena() == cudaSuccess, "disconnect, free_arena");
    }
    check(fake_cuda::primary_contexts == uint64_t(1) << 3,
          "a thread that never chose a device gets no context on cuda:0 from calls on cuda:3");
    check(fake_cuda::current_device == 3, "... and keeps cuda:3 current");
  }).join();
  std::thread([] {
    cudaSetDevice(0);  // chosen (its context made)
    IpcEndpoint ep;
    connect_to_self(ep, 3);
    check(ep.disconnect() == cudaSuccess && ep.free_arena() == cudaSuccess, "disconnect, free_arena");
    check(fake_cuda::current_device == 0, "a device the thread chose is restored");
  }).join();
  std::thread([] {
    cudaSetDevice(3);
    IpcEndpoint ep;
    connect_to_self(ep, 3);
    const int64_t calls = fake_cuda::set_device_calls;
    check(ep.disconnect() == cudaSuccess, "disconnect");
    check(fake_cuda::set_device_calls == calls + 1, "no restore when the device is current already");
    check(ep.free_arena() == cudaSuccess, "free_arena");
  }).join();
}

}  // namespace

int main() {
  words_outlive_the_arena();
  broken_device_keeps_the_words();
  release_races_abort_and_works();
  destructor_frees_no_exported_arena();
  enqueue_failure_fails_the_endpoint();
  restores_no_device_it_would_create();
  std::printf("%ld checks, %ld failures\n", long(checks), long(failures));
  return failures == 0 ? 0 : 1;
}
