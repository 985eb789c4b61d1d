#include "core/storage.h"

#include "core/allocator.h"
#include "core/error.h"
#include "core/pinned_memory.h"

namespace dpe {

namespace {
void* allocate(const Device& device, size_t nbytes, bool pinned, MemoryKind kind) {
  if (!pinned) return allocator_for(device).allocate(nbytes, kind);
  DPE_CHECK(device.is_cpu(), "pinned memory is host memory: it needs a CPU device, got ", device);
  check_device_exists(device);
  return pinned_host_allocator().allocate(nbytes);
}
}  // namespace

Storage::Storage(Device device, size_t nbytes, bool pinned)
    : device_(device), nbytes_(nbytes), pinned_(pinned), kind_(current_memory_kind()),
      data_(allocate(device, nbytes, pinned, kind_)) {}

Storage::~Storage() {
  if (pinned_) {
    pinned_host_allocator().deallocate(data_);
  } else {
    allocator_for(device_).deallocate(data_, nbytes_, kind_);
  }
}

void Storage::set_memory_kind(MemoryKind kind) {
  if (!pinned_) allocator_for(device_).retag(nbytes_, kind_, kind);
  kind_ = kind;
}

}  // namespace dpe
