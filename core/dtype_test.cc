#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/error.h"

namespace dpe {
namespace {

TEST(DTypeTest, NamesRoundTrip) {
  for (DType t : kAllDTypes) EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  EXPECT_THROW(parse_dtype("float8"), Error);
  EXPECT_EQ(element_size(DType::BFloat16), 2u);
  EXPECT_EQ(element_size(DType::Int64), 8u);
}

TEST(DTypeTest, HalfKnownValues) {
  EXPECT_EQ(float_to_half(1.0f).bits, 0x3c00);
  EXPECT_EQ(float_to_half(-2.0f).bits, 0xc000);
  EXPECT_EQ(float_to_half(65504.0f).bits, 0x7bff);             // largest finite
  EXPECT_EQ(float_to_half(65520.0f).bits, 0x7c00);             // rounds to +Inf
  EXPECT_EQ(float_to_half(5.9604645e-8f).bits, 0x0001);        // smallest subnormal
  EXPECT_EQ(float_to_half(1.0f + 1.0f / 2048).bits, 0x3c00);   // tie -> even (down)
  EXPECT_EQ(float_to_half(1.0f + 3.0f / 2048).bits, 0x3c02);   // tie -> even (up)
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(half_to_float(Half{0x7c00}), std::numeric_limits<float>::infinity());
  EXPECT_EQ(half_to_float(Half{0x0001}), 5.9604645e-8f);
}

TEST(DTypeTest, HalfRoundTripsEveryFiniteValue) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    Half h{static_cast<uint16_t>(bits)};
    if ((bits & 0x7c00) == 0x7c00 && (bits & 0x3ff) != 0) continue;  // NaN payloads
    EXPECT_EQ(float_to_half(half_to_float(h)).bits, h.bits) << std::hex << bits;
  }
}

TEST(DTypeTest, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bfloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(bfloat16_to_float(float_to_bfloat16(3.140625f)), 3.140625f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1).
  EXPECT_EQ(bfloat16_to_float(float_to_bfloat16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(bfloat16_to_float(float_to_bfloat16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(std::numeric_limits<float>::quiet_NaN()))));
}

}  // namespace
}  // namespace dpe
