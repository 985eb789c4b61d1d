#include "tests/testing/failing_new.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<bool> g_fail{false};
}  // namespace

void* operator new(size_t size) {
  if (g_fail.load(std::memory_order_relaxed)) throw std::bad_alloc();
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace dpe::testing {

FailingNew::FailingNew() { g_fail.store(true); }
FailingNew::~FailingNew() { g_fail.store(false); }

}  // namespace dpe::testing
