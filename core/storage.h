// Storage: one allocation on one device, owned (move-only) and returned to the device's caching
// allocator when the last Tensor viewing it goes away. Tensors share Storage through shared_ptr.
#pragma once

#include <cstddef>

#include "core/device.h"

namespace dpe {

class Storage {
 public:
  Storage(Device device, size_t nbytes);  // uninitialised memory from allocator_for(device)
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  const Device& device() const { return device_; }

 private:
  Device device_;
  size_t nbytes_;
  void* data_;
};

}  // namespace dpe
