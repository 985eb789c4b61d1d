// Temporary host buffers of the CPU kernels (oneDNN scratchpads, arguments reordered into oneDNN's layouts):
// 64-byte aligned, uninitialised, and kept per thread for reuse once released.
//
// Why a cache: a training step calls the same kernels with the same sizes every step. From malloc, these
// buffers (megabytes each) came and went with their arena's heap: a device worker's 64 MiB heap was unmapped
// and mapped again about once a step, and faulting its pages back in was ~6% of the bfloat16 DDP CNN step
// (perf; `strace -c`: 678 munmap calls in 110 steps). Tensors have the device allocators' cache (core/
// allocator.h); these buffers, which belong to no device, have this one.
//
// Contract: a buffer is released on the thread that took it (they live inside one kernel call). A thread
// keeps every block it has released until it exits; when a new block cannot be allocated, the thread's
// cached blocks are freed and the allocation tried once more.
#pragma once

#include <cstddef>
#include <memory>

namespace dpe::kernels::detail {

struct ScratchDeleter {
  size_t size = 0;  // the block's rounded size: its place in the thread's cache
  void operator()(void* p) const noexcept;
};
using ScratchBuffer = std::unique_ptr<void, ScratchDeleter>;

// At least `bytes` bytes (rounded up to 64); null when out of memory (the caller reports it, naming its use).
ScratchBuffer scratch(size_t bytes);

}  // namespace dpe::kernels::detail
