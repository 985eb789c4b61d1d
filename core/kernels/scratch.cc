#include "core/kernels/scratch.h"

#include <cstdlib>
#include <new>

#include "core/allocator.h"

namespace dpe::kernels::detail {
namespace {

struct ThreadCache {
  dpe::detail::BlockCache blocks;
  ~ThreadCache() { release(); }
  void release() { dpe::detail::release_cached(blocks, [](void* p, size_t) { std::free(p); }); }
};

ThreadCache& thread_cache() {
  thread_local ThreadCache cache;
  return cache;
}

}  // namespace

void ScratchDeleter::operator()(void* p) const noexcept {
  if (p != nullptr) dpe::detail::put_cached(thread_cache().blocks, size, p);
}

ScratchBuffer scratch(size_t bytes) {
  const size_t size = bytes <= 64 ? 64 : (bytes + 63) / 64 * 64;
  ThreadCache& cache = thread_cache();
  if (void* p = dpe::detail::take_cached(cache.blocks, size)) return ScratchBuffer(p, {size});
  try {
    dpe::detail::add_block(cache.blocks, size);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
  void* p = std::aligned_alloc(64, size);
  if (p == nullptr) {  // out of memory: give this thread's cached blocks back and try once more
    cache.release();
    p = std::aligned_alloc(64, size);
  }
  if (p == nullptr) {
    dpe::detail::remove_block(cache.blocks, size);
    return nullptr;
  }
  return ScratchBuffer(p, {size});
}

}  // namespace dpe::kernels::detail
