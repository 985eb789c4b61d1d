// A GoogleTest binary for run_suite_test.sh: stands in for a bundled test binary, with one case whose name
// run_suite.sh's CUDA filter picks (*Gpu*) and one it does not. It makes no CUDA call. FIXTURE_FAIL=1 makes
// the picked case fail.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

TEST(HostOnly, NamedLikeAGpuTest) {
  const char* fail = std::getenv("FIXTURE_FAIL");
  EXPECT_NE(std::string(fail == nullptr ? "" : fail), "1") << "FIXTURE_FAIL=1";
}

TEST(HostOnly, OutsideTheFilter) { SUCCEED(); }
