// FailingNew: while one is alive, every `operator new` of the test binary throws std::bad_alloc, on every
// thread (or, constructed with kThisThread, on the constructing thread only). For tests that check that a
// path which must not allocate (a worker pool's run, an allocator giving a block back from a destructor)
// really allocates nothing: if it does, the test sees bad_alloc, or std::terminate where the path is
// noexcept; and, on one thread, for tests of what a failure handler does when memory has run out there.
//
// The replacement operator new lives in failing_new.cc (a static, always-linked library, so that it
// replaces the C++ runtime's in the test executable). It covers the plain and sized forms, which is what
// the standard containers use; malloc is not affected. A kThisThread FailingNew may be destroyed on another
// thread (held by an exception object, say): it ends the failures of the thread that constructed it, which
// must still be running.
#pragma once

#include <atomic>

namespace dpe::testing {

class FailingNew {
 public:
  struct ThisThread {};
  static constexpr ThisThread kThisThread{};

  FailingNew();
  explicit FailingNew(ThisThread);
  ~FailingNew();
  FailingNew(const FailingNew&) = delete;
  FailingNew& operator=(const FailingNew&) = delete;

 private:
  std::atomic<bool>* flag_;  // the global flag, or the constructing thread's
};

}  // namespace dpe::testing
