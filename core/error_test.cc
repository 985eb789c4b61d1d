// dpe::Error's message: what a caller sees, whole, whatever bytes the values in it hold.
#include "core/error.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/testing/errors.h"

namespace dpe {
namespace {

// A tensor name read from a checkpoint may hold a NUL (what() would end there) or a terminal escape.
TEST(Error, ControlBytesAreShownAsEscapes) {
  const std::string name = std::string("w\0eight", 7);
  const std::string e = testing::error_of([&] { DPE_CHECK(false, "tensor '", name, "' \x1b[31mred\x7f, line\n\tnext"); });
  EXPECT_EQ(e.rfind("tensor 'w\\0eight' \\x1b[31mred\\x7f, line\n\tnext (core/error_test.cc:", 0), 0u) << e;
  EXPECT_EQ(std::string(Error(std::string("a\0b", 3)).what()), "a\\0b");
  EXPECT_EQ(std::string(Error("plain").what()), "plain");
}

}  // namespace
}  // namespace dpe
