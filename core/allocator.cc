#include "core/allocator.h"

#include <cstdlib>
#include <deque>

#include "core/error.h"

#if DPE_WITH_CUDA
#include "core/cuda/cuda_allocator.h"
#endif

namespace dpe {

namespace {

constexpr size_t kAlignment = 64;      // cache line; also what AVX-512 loads like
constexpr size_t kRoundBytes = 512;    // small sizes share blocks of the same rounded size
constexpr size_t kLargeRound = 1 << 20;  // above 16 MiB, round to whole MiB to keep the cache reusable

class CpuBackendAllocator final : public BackendAllocator {
 public:
  void* allocate(size_t nbytes) override { return std::aligned_alloc(kAlignment, nbytes); }
  void deallocate(void* ptr) override { std::free(ptr); }
};

std::unique_ptr<BackendAllocator> make_backend(const Device& d) {
  if (d.is_cpu()) return std::make_unique<CpuBackendAllocator>();
#if DPE_WITH_CUDA
  return cuda::make_cuda_backend_allocator(d.index);
#else
  DPE_INTERNAL_ASSERT(false, "no CUDA backend in this build for ", d);
#endif
}

}  // namespace

void* detail::take_cached(BlockCache& cache, size_t size) {
  auto it = cache.find(size);
  if (it == cache.end() || it->second.free.empty()) return nullptr;
  void* ptr = it->second.free.back();
  it->second.free.pop_back();
  return ptr;
}

void detail::add_block(BlockCache& cache, size_t size) {
  SizeClass& c = cache[size];
  c.free.reserve(c.blocks + 1);
  ++c.blocks;
}

void detail::remove_block(BlockCache& cache, size_t size) noexcept {
  auto it = cache.find(size);
  DPE_INTERNAL_ASSERT(it != cache.end() && it->second.blocks > it->second.free.size(), "no block of ", size,
                      " bytes outside the cache");
  if (--it->second.blocks == 0) cache.erase(it);
}

void detail::put_cached(BlockCache& cache, size_t size, void* ptr) noexcept {
  auto it = cache.find(size);
  DPE_INTERNAL_ASSERT(it != cache.end() && it->second.free.size() < it->second.blocks, "a block of ", size,
                      " bytes was given back without its place in the cache");
  it->second.free.push_back(ptr);  // within the capacity add_block reserved
}

void detail::release_cached(BlockCache& cache, const std::function<void(void*, size_t)>& release) {
  for (auto it = cache.begin(); it != cache.end();) {
    const size_t size = it->first;
    SizeClass& c = it->second;
    while (!c.free.empty()) {
      void* ptr = c.free.back();
      c.free.pop_back();
      --c.blocks;
      release(ptr, size);
    }
    it = c.blocks == 0 ? cache.erase(it) : std::next(it);
  }
}

CachingAllocator::CachingAllocator(Device device, std::unique_ptr<BackendAllocator> backend)
    : device_(device), backend_(std::move(backend)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard lock(mutex_);
  release_cache_locked();
}

size_t CachingAllocator::round_size(size_t nbytes) {
  // Rounding up would wrap for sizes within a MiB of SIZE_MAX (a tiny block for a huge request); no address
  // space holds more than 2^63 bytes, so such a request is out of memory whatever the device.
  DPE_CHECK_WITH(ErrorKind::OutOfMemory, nbytes <= size_t{1} << 63, "out of memory: cannot allocate ", nbytes,
                 " bytes (more than any address space holds)");
  if (nbytes > 16 * kLargeRound) return (nbytes + kLargeRound - 1) / kLargeRound * kLargeRound;
  return (nbytes + kRoundBytes - 1) / kRoundBytes * kRoundBytes;
}

const char* memory_kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::Activations: return "activations";
    case MemoryKind::Parameters: return "parameters";
    case MemoryKind::Gradients: return "gradients";
    case MemoryKind::OptimizerState: return "optimizer_state";
  }
  return "?";
}

namespace {
thread_local MemoryKind current_kind = MemoryKind::Activations;
}  // namespace

MemoryKindGuard::MemoryKindGuard(MemoryKind kind) : previous_(current_kind) { current_kind = kind; }
MemoryKindGuard::~MemoryKindGuard() { current_kind = previous_; }
MemoryKind current_memory_kind() { return current_kind; }

void* CachingAllocator::allocate(size_t nbytes, MemoryKind kind) {
  if (nbytes == 0) return nullptr;
  size_t size = round_size(nbytes);
  std::lock_guard lock(mutex_);
  void* ptr = detail::take_cached(cache_, size);
  if (ptr == nullptr) {
    detail::add_block(cache_, size);
    ptr = backend_->allocate(size);
    if (ptr == nullptr) {  // out of memory: give the cache back and try once more
      release_cache_locked();
      ptr = backend_->allocate(size);
    }
    if (ptr == nullptr) {
      detail::remove_block(cache_, size);
      int64_t free_bytes = backend_->free_bytes();
      DPE_CHECK_WITH(ErrorKind::OutOfMemory, false, "out of memory on ", device_, ": tried to allocate ", size,
                     " bytes with ", stats_.allocated_bytes, " bytes already allocated",
                     free_bytes >= 0 ? detail::str_cat(" and ", free_bytes, " bytes free on the device") : "");
    }
    stats_.reserved_bytes += size;
    ++stats_.num_backend_allocations;
  }
  ++stats_.num_allocations;
  stats_.allocated_bytes += size;
  stats_.allocated_by_kind[static_cast<size_t>(kind)] += static_cast<int64_t>(size);
  if (stats_.allocated_bytes > stats_.peak_allocated_bytes) {
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
    stats_.peak_by_kind = stats_.allocated_by_kind;
  }
  return ptr;
}

void CachingAllocator::deallocate(void* ptr, size_t nbytes, MemoryKind kind) noexcept {
  if (ptr == nullptr) return;
  size_t size = round_size(nbytes);
  std::lock_guard lock(mutex_);
  stats_.allocated_bytes -= size;
  stats_.allocated_by_kind[static_cast<size_t>(kind)] -= static_cast<int64_t>(size);
  DPE_INTERNAL_ASSERT(stats_.allocated_bytes >= 0 && stats_.allocated_by_kind[static_cast<size_t>(kind)] >= 0,
                      "allocator accounting went negative on ", device_);
  detail::put_cached(cache_, size, ptr);
}

void CachingAllocator::retag(size_t nbytes, MemoryKind from, MemoryKind to) noexcept {
  if (nbytes == 0 || from == to) return;
  const auto size = static_cast<int64_t>(round_size(nbytes));
  std::lock_guard lock(mutex_);
  stats_.allocated_by_kind[static_cast<size_t>(from)] -= size;
  stats_.allocated_by_kind[static_cast<size_t>(to)] += size;
  DPE_INTERNAL_ASSERT(stats_.allocated_by_kind[static_cast<size_t>(from)] >= 0, "allocator accounting went "
                      "negative on ", device_);
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_by_kind = stats_.allocated_by_kind;
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  release_cache_locked();
}

void CachingAllocator::release_cache_locked() {
  detail::release_cached(cache_, [&](void* ptr, size_t size) {
    stats_.reserved_bytes -= size;
    backend_->deallocate(ptr);
  });
}

CachingAllocator& allocator_for(const Device& d) {
  check_device_exists(d);
  // Allocators are never destroyed: a tensor in static storage may be freed after main() returns,
  // and the CUDA runtime may already be gone by then. A deque keeps references valid as devices are added.
  static auto* mutex = new std::mutex;
  static auto* per_kind = new std::deque<std::unique_ptr<CachingAllocator>>[2];
  std::lock_guard lock(*mutex);
  auto& allocators = per_kind[static_cast<int>(d.kind)];
  while (static_cast<int>(allocators.size()) <= d.index) allocators.emplace_back();
  auto& slot = allocators[d.index];
  if (!slot) slot = std::make_unique<CachingAllocator>(d, make_backend(d));
  return *slot;
}

MemoryStats memory_stats(const Device& d) { return allocator_for(d).stats(); }
void reset_peak_memory_stats(const Device& d) { allocator_for(d).reset_peak(); }
void empty_cache(const Device& d) { allocator_for(d).empty_cache(); }

}  // namespace dpe
