#include "core/kernels/scratch.h"

#include <pthread.h>

#include <cstdlib>
#include <new>

#include "core/allocator.h"
#include "core/error.h"

namespace dpe::kernels::detail {
namespace {

struct ThreadCache {
  dpe::detail::BlockCache blocks;
  ~ThreadCache() { release(); }
  void release() { dpe::detail::release_cached(blocks, [](void* p, size_t) { std::free(p); }); }
};

// Note [A thread's cache without a TLS destructor]
// A thread_local object with a destructor makes glibc allocate the first time a thread touches it, and glibc
// ends the process when that allocation fails ("Fatal glibc error: failed to register TLS destructor: out of
// memory", status 134). Kernels take scratch inside oneTBB tasks, so that first touch happens on whichever
// thread runs a task, at any time of a run (alloc_failure_test's random probe found it once in ~400 CNN
// trainings, in the test-set evaluation). So a thread's cache is a plain pointer, made with nothrow new, and
// its clean-up at thread exit a pthread key's destructor: the key is made once per process, and setting it
// either allocates nothing or fails with ENOMEM, which scratch() reports as out of memory like any other.
thread_local ThreadCache* t_cache = nullptr;  // trivially destructible: nothing registered with glibc

pthread_key_t cache_key() {
  static const pthread_key_t key = [] {
    pthread_key_t k;
    // Runs on the exiting thread: a scratch() after it (another destructor's) makes a new cache.
    const int rc = pthread_key_create(&k, [](void* cache) {
      delete static_cast<ThreadCache*>(cache);
      t_cache = nullptr;
    });
    DPE_INTERNAL_ASSERT(rc == 0, "scratch: pthread_key_create failed with ", rc);
    return k;
  }();
  return key;
}

// This thread's cache, made on its first use; null when it cannot be made (out of memory). Throws only
// where the process has no pthread key left, on its first call.
ThreadCache* thread_cache() {
  if (t_cache == nullptr) {
    auto* made = new (std::nothrow) ThreadCache;
    if (made == nullptr || pthread_setspecific(cache_key(), made) != 0) {
      delete made;
      return nullptr;
    }
    t_cache = made;
  }
  return t_cache;
}

}  // namespace

void ScratchDeleter::operator()(void* p) const noexcept {
  // The thread that took p (the contract's) has its cache: scratch() made it first.
  if (p != nullptr) dpe::detail::put_cached(t_cache->blocks, size, p);
}

ScratchBuffer scratch(size_t bytes) {
  const size_t size = bytes <= 64 ? 64 : (bytes + 63) / 64 * 64;
  ThreadCache* made = thread_cache();
  if (made == nullptr) return nullptr;
  ThreadCache& cache = *made;
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
