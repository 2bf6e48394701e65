#include "cuda_ipc_rendezvous.h"

#include "gpu_placement.h"

#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <sstream>
#include <vector>

namespace fastpar {
namespace distributed {
namespace {

constexpr const char* kRoot = "ipc/";

std::string key(const char* round, int rank) { return std::string(kRoot) + round + "/" + std::to_string(rank); }

// Publishes `mine` for `round`, then returns every rank's value in rank order.
// Waits for one rank at a time so that a timeout names the missing rank.
std::vector<std::string> exchange(c10d::Store& store, const char* round, int rank, int size, const std::string& mine,
                                  std::chrono::milliseconds timeout) {
  store.set(key(round, rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<std::string> all(static_cast<size_t>(size));
  for (int q = 0; q < size; ++q) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    try {
      store.wait({key(round, q)}, std::max(left, std::chrono::milliseconds(1)));
    } catch (const std::exception& e) {
      C10_THROW_ERROR(DistBackendError,
                      "fastpar: CUDA IPC setup (first CUDA all_reduce) on rank " + std::to_string(rank) +
                          " timed out after " + std::to_string(timeout.count()) + " ms waiting for rank " +
                          std::to_string(q) + " in round '" + round +
                          "' (every rank must call the same collectives): " + e.what());
    }
    const std::vector<uint8_t> v = store.get(key(round, q));
    all[size_t(q)] = std::string(v.begin(), v.end());
  }
  return all;
}

// "1" or "0 <reason>" per rank -> the first failing rank's reason, or "".
std::string first_refusal(const std::vector<std::string>& votes, const char* what) {
  for (size_t q = 0; q < votes.size(); ++q) {
    if (votes[q] != "1") return "rank " + std::to_string(q) + " " + what + ": " + votes[q].substr(std::min<size_t>(2, votes[q].size()));
  }
  return "";
}

std::string vote(const std::string& reason) { return reason.empty() ? "1" : "0 " + reason; }

// This process's name for `device` (gpu_placement.h: PCI bus id and UUID).
std::string gpu_id(int device) {
  char bus[64] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof(bus), device) != cudaSuccess) {
    cudaGetLastError();  // not sticky: keep it from surfacing in a later launch check
    return cuda_ipc::unknown_gpu();
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return cuda_ipc::unknown_gpu();
  }
  unsigned char uuid[16];
  std::memcpy(uuid, prop.uuid.bytes, sizeof(uuid));
  return cuda_ipc::gpu_identity(bus, cuda_ipc::uuid_text(uuid));
}

// gpu_id of every device this process sees, by device index.
std::vector<std::string> visible_gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  std::vector<std::string> ids;
  for (int d = 0; d < n; ++d) ids.push_back(gpu_id(d));
  return ids;
}

// Why this rank (on `device`, named `mine`) cannot map peer q's GPU (named
// `peer`), or "". `visible`: visible_gpus().
std::string probe_peer(int device, const std::string& mine, const std::vector<std::string>& visible, int q,
                       const std::string& peer) {
  if (cuda_ipc::sibling_mig_instances(mine, peer))
    return "is on a MIG instance (UUID " + cuda_ipc::gpu_uuid(mine) + ") of the GPU at PCI bus id " +
           cuda_ipc::gpu_bus(mine) + ", rank " + std::to_string(q) + " on another (UUID " + cuda_ipc::gpu_uuid(peer) +
           "), and CUDA IPC does not cross MIG instances";
  int dq = -1;
  for (size_t d = 0; d < visible.size() && dq < 0; ++d)
    if (cuda_ipc::same_gpu(visible[d], peer)) dq = int(d);
  if (dq < 0)
    return "cannot see rank " + std::to_string(q) + "'s GPU (PCI bus id/UUID " + peer +
           ") among its visible devices (CUDA_VISIBLE_DEVICES)";
  // Ranks sharing one GPU: IPC handles open in another process on the same
  // device, and the arena is then plain local memory to both; no peer access
  // to enable.
  if (dq == device) return "";
  int can = 0;
  if (cudaDeviceCanAccessPeer(&can, device, dq) != cudaSuccess) {
    cudaGetLastError();
    can = 0;
  }
  if (!can)
    return "has no peer access from its GPU (" + mine + ") to rank " + std::to_string(q) + "'s (" + peer + ")";
  return "";
}

}  // namespace

IpcRendezvous ipc_rendezvous(c10d::Store& store, int rank, int size, int device, int64_t max_ipc_bytes,
                             int64_t slot_bytes, int64_t registered_bytes, std::chrono::milliseconds timeout) {
  IpcRendezvous out;
  // Every visible GPU's name, once: this rank's for the cfg round, the rest
  // for finding peers' GPUs in the probe.
  const std::vector<std::string> visible = visible_gpus();
  const std::string my_gpu = size_t(device) < visible.size() ? visible[size_t(device)] : cuda_ipc::unknown_gpu();

  // cfg: the knobs must match, or ranks would route the same call differently.
  std::ostringstream cfg;
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) sms = 0;
  cfg << max_ipc_bytes << " " << slot_bytes << " " << registered_bytes << " " << my_gpu << " " << int64_t(getpid())
      << " " << sms;
  const std::vector<std::string> cfgs = exchange(store, "cfg", rank, size, cfg.str(), timeout);
  std::vector<std::string> gpus(static_cast<size_t>(size));
  out.pids.assign(size_t(size), -1);
  int fewest_sms = INT_MAX;
  for (int q = 0; q < size; ++q) {
    std::istringstream in(cfgs[size_t(q)]);
    int64_t max_q = -1, slot_q = -1, reg_q = -1;
    int sms_q = 0;
    in >> max_q >> slot_q >> reg_q >> gpus[size_t(q)] >> out.pids[size_t(q)] >> sms_q;
    fewest_sms = std::min(fewest_sms, sms_q);
    TORCH_CHECK_VALUE(max_q == max_ipc_bytes, "fastpar: FASTPAR_CUDA_IPC_MAX_BYTES is ", max_q, " on rank ", q, " but ",
                max_ipc_bytes, " on rank ", rank, "; it must be equal on every rank (it picks each call's route)");
    TORCH_CHECK_VALUE(slot_q == slot_bytes, "fastpar: FASTPAR_CUDA_IPC_SLOT_BYTES is ", slot_q, " on rank ", q, " but ",
                slot_bytes, " on rank ", rank, "; it must be equal on every rank");
    TORCH_CHECK_VALUE(reg_q == registered_bytes, "fastpar: FASTPAR_CUDA_IPC_REGISTERED_BYTES is ", reg_q, " on rank ",
                q, " but ", registered_bytes, " on rank ", rank, "; it must be equal on every rank (the arenas' layout)");
  }
  // Decided from the cfg round only, so every rank gets the same answer
  // (gpu_placement.h). The one-kernel calls' grids: block b of every rank
  // waits for block b of the others, so every grid on a GPU must be resident
  // at once; the most ranks on one GPU share the fewest SMs of the group's
  // GPUs at the kernels' blocks per SM.
  const cuda_ipc::GpuPlacement placed = cuda_ipc::place_ranks(gpus, rank);
  out.group_shares_gpu = placed.group_shares_gpu;
  out.ranks_on_my_gpu = placed.ranks_on_my_gpu;
  out.fused_grid_blocks = cuda_ipc::fused_grid_blocks(fewest_sms, placed.most_on_a_gpu);
  if (max_ipc_bytes == 0) {
    out.why_not = "FASTPAR_CUDA_IPC_MAX_BYTES=0";
    return out;
  }

  // probe
  std::string reason;
  for (int q = 0; q < size && reason.empty(); ++q) {
    if (q != rank) reason = probe_peer(device, my_gpu, visible, q, gpus[size_t(q)]);
  }
  out.why_not = first_refusal(exchange(store, "probe", rank, size, vote(reason), timeout), "refused IPC");
  if (!out.why_not.empty()) return out;

  // handle: a rank that cannot allocate still publishes (its error), so nobody waits in vain.
  auto ep = std::make_shared<cuda_ipc::IpcEndpoint>();
  cudaIpcMemHandle_t h{};
  cudaError_t err = ep->create(rank, size, device, size_t(slot_bytes), size_t(registered_bytes));
  if (err == cudaSuccess) err = ep->export_handle(&h);
  // "H" + the 64 handle bytes, or "E" + the error: a tag, since an error text could be 64 bytes long.
  std::string mine = err == cudaSuccess ? "H" + std::string(reinterpret_cast<const char*>(&h), sizeof(h))
                                        : std::string("E") + cudaGetErrorString(err);
  if (err != cudaSuccess) cudaGetLastError();
  const std::vector<std::string> handles = exchange(store, "handle", rank, size, mine, timeout);
  std::vector<cudaIpcMemHandle_t> hs(static_cast<size_t>(size));
  for (int q = 0; q < size; ++q) {
    const std::string& hq = handles[size_t(q)];
    if (hq.empty() || hq[0] != 'H' || hq.size() != 1 + sizeof(cudaIpcMemHandle_t)) {
      // Nobody mapped anything yet: every rank frees its own arena at once
      // (explicitly: the endpoint's destructor would abandon an exported one).
      out.why_not = "rank " + std::to_string(q) + " could not allocate or export its IPC arena: " +
                    hq.substr(std::min<size_t>(1, hq.size()));
      ep->free_arena();
      return out;
    }
    std::memcpy(&hs[size_t(q)], hq.data() + 1, sizeof(cudaIpcMemHandle_t));
  }

  // open
  err = ep->connect(hs.data());
  if (err != cudaSuccess) cudaGetLastError();
  try {
    out.why_not = first_refusal(
        exchange(store, "open", rank, size, vote(err == cudaSuccess ? "" : cudaGetErrorString(err)), timeout),
        "could not map a peer's IPC arena");
  } catch (...) {
    // Peers may have mapped our arena, and one that saw every vote goes on
    // to use it: with no barrier possible, it is left to the driver (as the
    // endpoint's destructor would; said here, where it matters).
    ep->disconnect();
    ep->abandon_arena();
    throw;
  }
  if (out.why_not.empty()) {
    out.endpoint = std::move(ep);
    return out;
  }

  // unwind: peers may have mapped our arena; free it only once all have unmapped.
  ep->disconnect();
  try {
    exchange(store, "unwind", rank, size, "1", timeout);
  } catch (...) {
    ep->abandon_arena();
    throw;
  }
  ep->free_arena();
  return out;
}

bool ipc_farewell(c10d::Store& store, int rank, int size, std::chrono::milliseconds timeout) noexcept {
  try {
    exchange(store, "bye", rank, size, "1", timeout);
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace distributed
}  // namespace fastpar
