// cudaMalloc/cudaFree backend for the logical device's caching allocator (core/allocator.h).
#pragma once

#include <memory>

#include "core/allocator.h"

namespace dpe::cuda {
std::unique_ptr<BackendAllocator> make_cuda_backend_allocator(int logical);
}  // namespace dpe::cuda
