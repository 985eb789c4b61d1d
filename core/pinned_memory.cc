#include "core/pinned_memory.h"

#include <algorithm>

#include "core/device.h"
#include "core/error.h"

#if DPE_WITH_CUDA
#include "core/cuda/cuda_device.h"
#include "core/cuda/cuda_host_allocator.h"
#endif

namespace dpe {

CachingHostAllocator::CachingHostAllocator(std::unique_ptr<HostAllocatorBackend> backend)
    : backend_(std::move(backend)) {}

CachingHostAllocator::~CachingHostAllocator() { empty_cache(); }

void* CachingHostAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  const size_t size = CachingAllocator::round_size(nbytes);
  std::lock_guard lock(mutex_);
  collect_completed_locked();
  void* ptr = detail::take_cached(free_, size);
  if (ptr == nullptr) {
    // Room for the new block in free_ and awaiting_ first, so that deallocate never allocates.
    awaiting_.reserve(blocks_.size() + 1);
    detail::add_block(free_, size);
    ptr = backend_->allocate(size);
    if (ptr == nullptr) {  // out of pinned memory: give the cache back and try once more
      release_free_locked();
      ptr = backend_->allocate(size);
    }
    if (ptr == nullptr) detail::remove_block(free_, size);
    DPE_CHECK(ptr != nullptr, "out of pinned host memory: tried to allocate ", size, " bytes with ",
              stats_.allocated_bytes, " bytes already allocated and ", stats_.reserved_bytes,
              " reserved (pinned memory is locked into RAM; use smaller batches or pin_memory=false)");
    try {
      blocks_[ptr].size = size;
    } catch (...) {
      backend_->deallocate(ptr);
      detail::remove_block(free_, size);
      throw;
    }
    stats_.reserved_bytes += static_cast<int64_t>(size);
    ++stats_.num_backend_allocations;
  }
  Block& block = blocks_.at(ptr);
  DPE_INTERNAL_ASSERT(!block.in_use && block.uses.empty(), "pinned block handed out twice");
  block.in_use = true;
  ++stats_.num_allocations;
  stats_.allocated_bytes += static_cast<int64_t>(size);
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  return ptr;
}

void CachingHostAllocator::deallocate(void* ptr) noexcept {
  if (ptr == nullptr) return;
  std::lock_guard lock(mutex_);
  auto it = blocks_.find(ptr);
  DPE_INTERNAL_ASSERT(it != blocks_.end() && it->second.in_use, "freeing a pointer that is not a live pinned block");
  Block& block = it->second;
  block.in_use = false;
  stats_.allocated_bytes -= static_cast<int64_t>(block.size);
  if (block.uses.empty()) {
    detail::put_cached(free_, block.size, ptr);
  } else {
    awaiting_.push_back(ptr);  // within the capacity reserved when the block was made
  }
}

bool CachingHostAllocator::record_use(const void* ptr, int device) {
  std::lock_guard lock(mutex_);
  auto it = blocks_.find(ptr);
  if (it == blocks_.end() || !it->second.in_use) return false;
  it->second.uses.push_back(backend_->record_event(device));
  return true;
}

void CachingHostAllocator::collect_completed_locked() {
  auto completed = [&](HostAllocatorBackend::Event e) {
    if (!backend_->query_event(e)) return false;
    backend_->destroy_event(e);
    return true;
  };
  auto now_free = [&](void* ptr) {
    Block& block = blocks_.at(ptr);
    std::erase_if(block.uses, completed);
    if (!block.uses.empty()) return false;
    detail::put_cached(free_, block.size, ptr);
    return true;
  };
  std::erase_if(awaiting_, now_free);
}

void CachingHostAllocator::release_free_locked() {
  detail::release_cached(free_, [&](void* ptr, size_t size) {
    blocks_.erase(ptr);
    stats_.reserved_bytes -= static_cast<int64_t>(size);
    backend_->deallocate(ptr);
  });
}

MemoryStats CachingHostAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void CachingHostAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  collect_completed_locked();
  release_free_locked();
}

bool pinned_memory_available() { return pinned_memory_unavailable_reason().empty(); }

std::string pinned_memory_unavailable_reason() {
#if DPE_WITH_CUDA
  if (cuda_available()) return "";
  return "no CUDA device is visible (" + cuda::unavailable_reason() + ")";
#else
  return "this build has no CUDA support (built with --config=cpu_only)";
#endif
}

CachingHostAllocator& pinned_host_allocator() {
  const std::string reason = pinned_memory_unavailable_reason();
  DPE_CHECK(reason.empty(), "pinned host memory needs a CUDA device, but ", reason);
#if DPE_WITH_CUDA
  // Never destroyed, like the device allocators: a pinned tensor may be freed after main() returns.
  static auto* allocator = new CachingHostAllocator(cuda::make_cuda_host_allocator_backend());
  return *allocator;
#else
  DPE_INTERNAL_ASSERT(false, "unreachable: no pinned memory without CUDA");
#endif
}

MemoryStats pinned_memory_stats() {
  return pinned_memory_available() ? pinned_host_allocator().stats() : MemoryStats{};
}

}  // namespace dpe
