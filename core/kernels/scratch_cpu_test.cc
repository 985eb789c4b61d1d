// The CPU kernels' scratch buffers (core/kernels/scratch.h): a released block is handed out again on its
// thread, never while held and never on another thread; out of memory is a null buffer, not an exception.
#include "core/kernels/scratch.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <future>
#include <thread>

namespace dpe::kernels::detail {
namespace {

TEST(ScratchTest, AReleasedBlockIsReusedForTheSameRoundedSize) {
  void* first = nullptr;
  {
    ScratchBuffer a = scratch(1000);
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.get()) % 64, 0u);
    first = a.get();
  }
  ScratchBuffer b = scratch(1024);  // 1000 and 1024 both round to 1024
  EXPECT_EQ(b.get(), first);
  ScratchBuffer c = scratch(1024);  // b still holds the cached one
  EXPECT_NE(c.get(), first);
  ScratchBuffer d = scratch(2048);
  EXPECT_NE(d.get(), first);
}

TEST(ScratchTest, ThreadsKeepTheirOwnBlocks) {
  void* released_here = nullptr;
  {
    ScratchBuffer a = scratch(4096);
    released_here = a.get();
  }
  // This thread holds the released block in its cache while another thread asks for the same size.
  void* there = std::async(std::launch::async, [] { return scratch(4096).get(); }).get();
  EXPECT_NE(there, released_here);
  EXPECT_EQ(scratch(4096).get(), released_here);
}

TEST(ScratchTest, OutOfMemoryIsANullBuffer) {
  ScratchBuffer huge = scratch(size_t{1} << 62);
  EXPECT_EQ(huge, nullptr);
  ScratchBuffer fine = scratch(64);  // the thread's cache is still usable
  EXPECT_NE(fine, nullptr);
}

}  // namespace
}  // namespace dpe::kernels::detail
