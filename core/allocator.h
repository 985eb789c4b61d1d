// Per-device caching allocators with memory statistics.
//
// Each device (every logical CPU device and every logical CUDA device) has its own allocator, so
// the engine can report the current and peak bytes per device (DP's master holds more than the other
// replicas: the report makes that visible).
//
// Caching: freed blocks are kept per exact (rounded) size and handed out again; training steps allocate
// the same sizes every step, so after the first step nothing reaches malloc/cudaMalloc. On CUDA a block
// is reused in the order of its device's single compute stream, which is safe because every kernel on a
// device runs on that stream and cross-device copies fence both streams (core/copy.cc).
//
// Thread-safety: all functions may be called from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/device.h"

namespace dpe {

// What a block holds, for the memory report (docs/DATA_PARALLEL.md "Memory"): a block takes the kind of the
// thread that allocates it (MemoryKindGuard; Activations, the default, stands for activations and every
// temporary), and may be given another one later (Storage::set_memory_kind: a gradient computed by the backward
// becomes a parameter's .grad). Tagged where the engine and autograd make them: parameters and buffers of every
// replica, .grad and the reducers' buckets and shards, and what an optimizer allocates in step() and
// load_state_dict() (its state, and its temporaries while it runs).
enum class MemoryKind : uint8_t { Activations, Parameters, Gradients, OptimizerState };
inline constexpr size_t kMemoryKinds = 4;
const char* memory_kind_name(MemoryKind kind);  // "activations", "parameters", "gradients", "optimizer_state"

// The kind this thread's allocations get while the guard lives (guards nest; the innermost wins).
class MemoryKindGuard {
 public:
  explicit MemoryKindGuard(MemoryKind kind);
  ~MemoryKindGuard();
  MemoryKindGuard(const MemoryKindGuard&) = delete;
  MemoryKindGuard& operator=(const MemoryKindGuard&) = delete;

 private:
  MemoryKind previous_;
};
MemoryKind current_memory_kind();

struct MemoryStats {
  int64_t allocated_bytes = 0;       // bytes in live tensors (rounded block sizes)
  int64_t peak_allocated_bytes = 0;  // max of allocated_bytes since start or reset_peak_memory_stats
  int64_t reserved_bytes = 0;        // allocated + cached (what the device really holds)
  int64_t num_allocations = 0;       // allocate() calls
  int64_t num_backend_allocations = 0;  // of which reached malloc / cudaMalloc (cache misses)
  // allocated_bytes by MemoryKind (indexed by its value), now and when peak_allocated_bytes was reached.
  std::array<int64_t, kMemoryKinds> allocated_by_kind{}, peak_by_kind{};
  int64_t by_kind(MemoryKind k) const { return allocated_by_kind[static_cast<size_t>(k)]; }
  int64_t at_peak(MemoryKind k) const { return peak_by_kind[static_cast<size_t>(k)]; }
};

namespace detail {
// The free blocks of one rounded size, in the cache of a device allocator or of the pinned host allocator.
// Invariant: `free` has capacity for all `blocks` blocks of this size that exist, cached or in use. The room
// is made when a block is created (add_block, which may throw), so giving a block back (put_cached) never
// allocates: blocks are given back from destructors, where running out of memory would end the process
// in std::terminate.
struct SizeClass {
  std::vector<void*> free;
  size_t blocks = 0;
};
using BlockCache = std::unordered_map<size_t, SizeClass>;
// Removes and returns a cached block of exactly `size` bytes, or nullptr when there is none.
void* take_cached(BlockCache& cache, size_t size);
// Makes room for one more block of `size`; call before creating it, and remove_block if creating it fails.
// Throws std::bad_alloc when out of memory, leaving the cache as it was.
void add_block(BlockCache& cache, size_t size);
// Forgets one block of `size` that is not in the cache (creating it failed, or it goes back to the backend).
void remove_block(BlockCache& cache, size_t size) noexcept;
// Returns a block of `size` made after add_block to the cache. Never allocates.
void put_cached(BlockCache& cache, size_t size, void* ptr) noexcept;
// Hands every cached block to `release(ptr, size)` and forgets it (a block is forgotten before its call, so
// the cache stays consistent when `release` throws).
void release_cached(BlockCache& cache, const std::function<void(void*, size_t)>& release);
}  // namespace detail

// Raw memory of one device. Implementations: CPU (aligned malloc), CUDA (cudaMalloc on the logical
// device's physical GPU). allocate() returns nullptr when out of memory; the caching layer then frees
// its cache, retries once, and reports a clear error naming the device.
class BackendAllocator {
 public:
  virtual ~BackendAllocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr) = 0;
  // Bytes the device could still hand out, for the out-of-memory message (-1 when unknown).
  virtual int64_t free_bytes() const { return -1; }
};

class CachingAllocator {
 public:
  CachingAllocator(Device device, std::unique_ptr<BackendAllocator> backend);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Returns a block of at least nbytes (nullptr for 0 bytes) counted as `kind`; throws dpe::Error naming the
  // device when the device is out of memory. (Storage passes its thread's current_memory_kind().)
  void* allocate(size_t nbytes, MemoryKind kind = MemoryKind::Activations);
  // `nbytes` and `kind` are those the block was allocated (or last retagged) with. Never throws (it runs in
  // destructors): the block's place in the cache was made when the block was created.
  void deallocate(void* ptr, size_t nbytes, MemoryKind kind = MemoryKind::Activations) noexcept;
  // Counts a live block of `nbytes` as `to` instead of `from` (the peak's split is what it was).
  void retag(size_t nbytes, MemoryKind from, MemoryKind to) noexcept;

  MemoryStats stats() const;
  void reset_peak();
  void empty_cache();  // returns every cached block to the backend

  static size_t round_size(size_t nbytes);  // the block size actually reserved for nbytes

 private:
  void release_cache_locked();

  Device device_;
  std::unique_ptr<BackendAllocator> backend_;
  mutable std::mutex mutex_;
  detail::BlockCache cache_;  // rounded size -> free blocks
  MemoryStats stats_;
};

// The allocator of device d (created on first use). Throws if d does not exist.
CachingAllocator& allocator_for(const Device& d);

MemoryStats memory_stats(const Device& d);
void reset_peak_memory_stats(const Device& d);
void empty_cache(const Device& d);

}  // namespace dpe
