#include "event_cache.h"

#include <mutex>
#include <unordered_map>

#include "cuda_try.h"

namespace fastpar {
namespace cuda_p2p {
namespace {

struct FreeLists {
  std::mutex mu;
  std::unordered_map<int, std::vector<cudaEvent_t>> by_device;
};

// Leaked on purpose: a static destructor would run after the CUDA runtime's
// own teardown at exit, where cudaEventDestroy is an error.
FreeLists& free_lists() {
  static FreeLists* lists = new FreeLists();
  return *lists;
}

}  // namespace

cudaError_t take_event(int device, cudaEvent_t* event) {
  FreeLists& lists = free_lists();
  {
    std::lock_guard<std::mutex> g(lists.mu);
    std::vector<cudaEvent_t>& list = lists.by_device[device];
    if (!list.empty()) {
      *event = list.back();
      list.pop_back();
      return cudaSuccess;
    }
  }
  DeviceRestore restore;
  FASTPAR_CUDA_TRY(cudaSetDevice(device));
  return cudaEventCreateWithFlags(event, cudaEventDisableTiming);
}

void give_back_event(int device, cudaEvent_t event) {
  FreeLists& lists = free_lists();
  std::lock_guard<std::mutex> g(lists.mu);
  lists.by_device[device].push_back(event);
}

}  // namespace cuda_p2p
}  // namespace fastpar
