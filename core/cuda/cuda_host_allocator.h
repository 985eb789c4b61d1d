// cudaHostAlloc/cudaFreeHost and CUDA events behind the pinned host allocator (core/pinned_memory.h).
#pragma once

#include <memory>

#include "core/pinned_memory.h"

namespace dpe::cuda {
std::unique_ptr<HostAllocatorBackend> make_cuda_host_allocator_backend();
}  // namespace dpe::cuda
