#include "tests/testing/failing_new.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<bool> g_fail{false};
thread_local std::atomic<bool> t_fail{false};  // constant-initialised: reading it allocates nothing
}  // namespace

void* operator new(size_t size) {
  if (g_fail.load(std::memory_order_relaxed) || t_fail.load(std::memory_order_relaxed)) throw std::bad_alloc();
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace dpe::testing {

FailingNew::FailingNew() : flag_(&g_fail) { flag_->store(true); }
FailingNew::FailingNew(ThisThread) : flag_(&t_fail) { flag_->store(true); }
FailingNew::~FailingNew() { flag_->store(false); }

}  // namespace dpe::testing
