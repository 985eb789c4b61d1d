// Storage: one allocation on one device, owned (move-only) and returned to the device's caching
// allocator when the last Tensor viewing it goes away. Tensors share Storage through shared_ptr.
// Pinned storage (CPU devices only) comes from the pinned host allocator (core/pinned_memory.h) instead;
// it is host memory like any CPU storage and is not counted in the CPU device's memory_stats.
#pragma once

#include <cstddef>

#include "core/allocator.h"
#include "core/device.h"

namespace dpe {

class Storage {
 public:
  // Uninitialised memory from allocator_for(device), or pinned host memory (device must be a CPU device;
  // throws when pinned memory is unavailable).
  Storage(Device device, size_t nbytes, bool pinned = false);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  const Device& device() const { return device_; }
  bool is_pinned() const { return pinned_; }
  // What the device's memory statistics count this storage as (core/allocator.h): the allocating thread's
  // MemoryKind until set. Not thread-safe against another set of the same storage.
  MemoryKind memory_kind() const { return kind_; }
  void set_memory_kind(MemoryKind kind);

 private:
  Device device_;
  size_t nbytes_;
  bool pinned_;
  MemoryKind kind_;
  void* data_;
};

}  // namespace dpe
