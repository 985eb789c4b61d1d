#include <gtest/gtest.h>

#if defined(__SANITIZE_THREAD__)
#include <tbb/global_control.h>
#endif

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
#if defined(__SANITIZE_THREAD__)
  // oneTBB's task hand-offs happen inside Debian's uninstrumented libtbb, so a kernel split across TBB
  // workers shows up as races in TBB's own templates. Under TSan every TBB parallel loop runs on the thread
  // that calls it (the engine's device workers, which TSan does see); the split itself is covered by the
  // normal builds' bit-identity tests.
  tbb::global_control serial_tbb(tbb::global_control::max_allowed_parallelism, 1);
#endif
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
