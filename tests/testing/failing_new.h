// FailingNew: while one is alive, every `operator new` of the test binary throws std::bad_alloc, on every
// thread. For tests that check that a path which must not allocate (a worker pool's run, an allocator giving
// a block back from a destructor) really allocates nothing: if it does, the test sees bad_alloc, or
// std::terminate where the path is noexcept.
//
// The replacement operator new lives in failing_new.cc (a static, always-linked library, so that it
// replaces the C++ runtime's in the test executable). It covers the plain and sized forms, which is what
// the standard containers use; malloc is not affected.
#pragma once

namespace dpe::testing {

class FailingNew {
 public:
  FailingNew();
  ~FailingNew();
  FailingNew(const FailingNew&) = delete;
  FailingNew& operator=(const FailingNew&) = delete;
};

}  // namespace dpe::testing
