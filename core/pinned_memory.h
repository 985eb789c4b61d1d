// Pinned (page-locked) host memory: PyTorch's CachingHostAllocator, behind Tensor::pin_memory(),
// TensorOptions::pinned_memory and DataLoaderOptions::pin_memory.
//
// Why: a GPU copies pinned memory by DMA straight from the page, and the copy may run asynchronously
// (Tensor::to(cuda, non_blocking=true)): the host goes on assembling the next batch while the current one
// is in flight. A copy from pageable memory is staged by the driver and returns only when it is done.
//
// The catch, and the whole point of the caching allocator: a pinned block freed by the host may still be
// read by a copy enqueued on a device stream. record_use() marks the block with an event on that stream; a
// freed block goes back to the cache only after all its events have completed, so it is never handed out
// (and overwritten) under a copy still reading it. cudaHostAlloc is also slow (it maps pages for every GPU):
// blocks are cached per rounded size, like the device allocators (core/allocator.h).
//
// Pinned memory exists only where a CUDA device does: pinned_memory_available() is false on the cpu_only
// build and on a CUDA build without a visible GPU; allocation then throws, naming the reason.
//
// Thread-safety: every function may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"

namespace dpe {

// What the caching layer needs from the platform. The CUDA implementation: cudaHostAlloc/cudaFreeHost and
// CUDA events; tests substitute events they complete by hand.
class HostAllocatorBackend {
 public:
  using Event = void*;
  virtual ~HostAllocatorBackend() = default;
  virtual void* allocate(size_t nbytes) = 0;  // nullptr when out of memory; throws on other errors
  virtual void deallocate(void* ptr) = 0;
  // An event that completes when the work enqueued so far on CUDA device `device`'s stream has run.
  virtual Event record_event(int device) = 0;
  virtual bool query_event(Event event) = 0;  // true once complete
  virtual void destroy_event(Event event) = 0;
};

class CachingHostAllocator {
 public:
  explicit CachingHostAllocator(std::unique_ptr<HostAllocatorBackend> backend);
  ~CachingHostAllocator();  // returns every cached block; blocks still in use are leaked, never freed under a copy
  CachingHostAllocator(const CachingHostAllocator&) = delete;
  CachingHostAllocator& operator=(const CachingHostAllocator&) = delete;

  // A block of at least nbytes (nullptr for 0 bytes); throws dpe::Error when pinned memory runs out.
  void* allocate(size_t nbytes);
  // ptr: a pointer allocate() returned. The block becomes reusable once every recorded use has completed.
  // Never throws (it runs in destructors): the block's places in free_ and awaiting_ were made with it.
  void deallocate(void* ptr) noexcept;
  // Marks the live block starting at `ptr` as read or written by work enqueued so far on CUDA device
  // `device`'s stream. Returns false (and records nothing) when ptr is not the start of a live pinned block.
  bool record_use(const void* ptr, int device);

  MemoryStats stats() const;
  void empty_cache();  // returns every free block whose uses have completed

 private:
  struct Block {
    size_t size = 0;
    bool in_use = false;
    std::vector<HostAllocatorBackend::Event> uses;  // events not yet seen complete
  };
  void collect_completed_locked();  // moves freed blocks whose uses completed into free_
  void release_free_locked();

  std::unique_ptr<HostAllocatorBackend> backend_;
  mutable std::mutex mutex_;
  std::unordered_map<const void*, Block> blocks_;  // every block held, by start address
  detail::BlockCache free_;                        // rounded size -> reusable blocks
  std::vector<void*> awaiting_;                    // freed, some use still pending
  MemoryStats stats_;
};

// True when pinned memory can be allocated: a CUDA build with at least one visible GPU.
bool pinned_memory_available();
// Why it cannot be ("this build has no CUDA support (--config=cpu_only)", the driver's message, ...);
// empty when available.
std::string pinned_memory_unavailable_reason();
// The process's pinned host allocator; throws dpe::Error naming the reason when unavailable.
CachingHostAllocator& pinned_host_allocator();
// Its statistics (all zero when unavailable).
MemoryStats pinned_memory_stats();

}  // namespace dpe
