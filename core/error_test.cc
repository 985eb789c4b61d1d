// dpe::Error's message: what a caller sees, whole, whatever bytes the values in it hold.
#include "core/error.h"

#include <gtest/gtest.h>

#include <string>

#include "core/tensor.h"
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

// A failure's kind travels with it: callers that handle some kinds ask it, never the message's text.
TEST(Error, KindsTravelWithTheError) {
  try {
    DPE_CHECK(false, "a bad value");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
  }
  try {
    DPE_CHECK_WITH(ErrorKind::OutOfMemory, false, "no room for ", 42, " bytes");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::OutOfMemory);
    EXPECT_EQ(std::string(e.what()).rfind("no room for 42 bytes (core/error_test.cc:", 0), 0u) << e.what();
  }
  try {
    DPE_INTERNAL_ASSERT(1 + 1 == 3, "arithmetic");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Internal);
  }
  EXPECT_EQ(Error("x", ErrorKind::Timeout).kind(), ErrorKind::Timeout);
  EXPECT_STREQ(error_kind_name(ErrorKind::DeviceLost), "device lost");
  // The allocator's out of memory is of that kind (tensor_test asks for 256 TiB).
  try {
    (void)Tensor::empty({int64_t{1} << 46});
    ADD_FAILURE() << "256 TiB were allocated";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::OutOfMemory) << e.what();
  }
}

}  // namespace
}  // namespace dpe
