// The CPU kernels' parallel helpers (kernels/cpu_parallel.h): what a failure in a parallel algorithm becomes.
#include "core/kernels/cpu_parallel.h"

#include <gtest/gtest.h>

#include <new>
#include <stdexcept>
#include <system_error>

#include "core/error.h"

namespace dpe::kernels::detail {
namespace {

// oneTBB's own failure to start a worker (a plain std::runtime_error) is a resource error; what a body throws
// passes unchanged.
TEST(TbbParallel, ThreadsThatCannotStartAreAResourceError) {
  try {
    tbb_parallel([] { throw std::runtime_error("pthread_create has failed: Resource temporarily unavailable"); });
    ADD_FAILURE() << "no exception";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), std::errc::resource_unavailable_try_again);
    EXPECT_NE(std::string(e.what()).find("oneTBB could not start a worker thread (pthread_create has failed"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(tbb_parallel([] { throw Error("a kernel's error"); }), Error);
  EXPECT_THROW(tbb_parallel([] { throw std::bad_alloc(); }), std::bad_alloc);
  EXPECT_THROW(parallel_range(kParallelGrain * 4, [](int64_t, int64_t) { throw Error("from a chunk"); }), Error);
}

}  // namespace
}  // namespace dpe::kernels::detail
