#include "core/storage.h"

#include "core/allocator.h"

namespace dpe {

Storage::Storage(Device device, size_t nbytes)
    : device_(device), nbytes_(nbytes), data_(allocator_for(device).allocate(nbytes)) {}

Storage::~Storage() { allocator_for(device_).deallocate(data_, nbytes_); }

}  // namespace dpe
