#include "handle_cache.h"

#include <mutex>
#include <unordered_map>

#include "cuda_try.h"

namespace fastpar {
namespace cuda_p2p {
namespace {

template <typename Handle>
struct FreeLists {
  std::mutex mu;
  std::unordered_map<int, std::vector<Handle>> by_device;
};

// Leaked on purpose: a static destructor would run after the CUDA runtime's
// own teardown at exit, where destroying a handle is an error.
template <typename Handle>
FreeLists<Handle>& free_lists() {
  static FreeLists<Handle>* lists = new FreeLists<Handle>();
  return *lists;
}

}  // namespace

cudaError_t take_event(int device, cudaEvent_t* event) {
  FreeLists<cudaEvent_t>& lists = free_lists<cudaEvent_t>();
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
  FreeLists<cudaEvent_t>& lists = free_lists<cudaEvent_t>();
  std::lock_guard<std::mutex> g(lists.mu);
  lists.by_device[device].push_back(event);
}

cudaError_t take_streams(int device, int count, std::vector<cudaStream_t>* streams) {
  FreeLists<cudaStream_t>& lists = free_lists<cudaStream_t>();
  std::vector<cudaStream_t> taken;
  {
    std::lock_guard<std::mutex> g(lists.mu);
    std::vector<cudaStream_t>& list = lists.by_device[device];
    while (int(taken.size()) < count && !list.empty()) {
      taken.push_back(list.back());
      list.pop_back();
    }
  }
  cudaError_t err = cudaSuccess;
  if (int(taken.size()) < count) {
    DeviceRestore restore;
    err = cudaSetDevice(device);
    while (err == cudaSuccess && int(taken.size()) < count) {
      cudaStream_t s = nullptr;
      err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      if (err == cudaSuccess) taken.push_back(s);
    }
  }
  if (err != cudaSuccess) {
    give_back_streams(device, taken);
    return err;
  }
  streams->insert(streams->end(), taken.begin(), taken.end());
  return cudaSuccess;
}

void give_back_streams(int device, const std::vector<cudaStream_t>& streams) {
  FreeLists<cudaStream_t>& lists = free_lists<cudaStream_t>();
  std::lock_guard<std::mutex> g(lists.mu);
  std::vector<cudaStream_t>& list = lists.by_device[device];
  // Reversed, so that the next take_streams pops them in their creation order.
  list.insert(list.end(), streams.rbegin(), streams.rend());
}

}  // namespace cuda_p2p
}  // namespace fastpar
