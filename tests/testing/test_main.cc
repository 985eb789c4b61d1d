#include <gtest/gtest.h>

#if defined(__SANITIZE_THREAD__)
// Under --config=tsan: oneDNN and its OpenMP runtime (libgomp) are Debian's uninstrumented builds, so
// ThreadSanitizer cannot see their thread hand-offs and reports races inside them (e.g. a oneDNN worker
// filling a scratchpad the caller allocated). Races in dpe's own code are still reported.
extern "C" const char* __tsan_default_suppressions() {
  return "race:libdnnl.so\n"
         "race:libgomp.so\n";
}
// allocator_test asks for 256 TiB on purpose and expects a clean out-of-memory error, not an abort.
extern "C" const char* __tsan_default_options() { return "allocator_may_return_null=1"; }
#endif

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
