// Layout of one rank's IPC arena: a single cudaMalloc allocation that the rank
// exports with cudaIpcGetMemHandle and every peer process maps.
//
//   [ flags::ControlBlock | status word | pad ]  kHeaderBytes
//   [ data slot 0 ]                              slot_bytes (rounded to 512)
//   [ data slot 1 ]                              (flags::kSlots rotating slots)
//
// Only the owner writes its arena (the protocol's single-writer rule); peers
// read the control block and the slots through their mapping. The status word
// is the owner's private record of a failed phase (a flags::WaitStatus): every
// later kernel of the transport checks it and does nothing, and the host reads
// it to raise the error.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../../algorithms/flag_protocol.h"

namespace fastpar {
namespace cuda_ipc {

constexpr int kMaxIpcRanks = 8;  // = the reduce kernel's source limit: one per GPU of a node
constexpr size_t kHeaderBytes = 512;
constexpr size_t kSlotAlign = 512;  // keeps every slot 16-byte aligned for the uint4 path

static_assert(sizeof(flags::ControlBlock) + sizeof(uint32_t) <= kHeaderBytes, "header overflows");

FASTPAR_HD size_t slot_stride(size_t slot_bytes) { return (slot_bytes + kSlotAlign - 1) / kSlotAlign * kSlotAlign; }

FASTPAR_HD size_t arena_bytes(size_t slot_bytes) {
  return kHeaderBytes + size_t(flags::kSlots) * slot_stride(slot_bytes);
}

FASTPAR_HD flags::ControlBlock* control_of(void* base) { return static_cast<flags::ControlBlock*>(base); }

FASTPAR_HD uint32_t* status_of(void* base) {
  return reinterpret_cast<uint32_t*>(static_cast<char*>(base) + sizeof(flags::ControlBlock));
}

FASTPAR_HD char* slot_of(void* base, size_t slot_bytes, int k) {
  return static_cast<char*>(base) + kHeaderBytes + size_t(k) * slot_stride(slot_bytes);
}

}  // namespace cuda_ipc
}  // namespace fastpar
