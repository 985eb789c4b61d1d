// copy_cpu / fill_cpu against element-by-element references: every dtype pair, strided and broadcast
// layouts, the parallel path, and the rounding / saturation rules of core/kernels/copy.h.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/kernels/copy.h"
#include "tests/testing/kernel_test_util.h"

namespace dpe::kernels {
namespace {

// A buffer of n elements of any dtype, read and written as double by the test (Half/BFloat16 through
// dtype.h's float conversions, which are exact for the values used with them).
struct Buffer {
  DType dtype;
  std::vector<unsigned char> bytes;

  Buffer(DType t, int64_t n) : dtype(t), bytes(static_cast<size_t>(n) * element_size(t)) {}

  void* data() { return bytes.data(); }
  int64_t size() const { return static_cast<int64_t>(bytes.size() / element_size(dtype)); }

  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(bytes.data());
  }

  void set(int64_t i, double v) {
    switch (dtype) {
      case DType::Float32: as<float>()[i] = static_cast<float>(v); break;
      case DType::Float64: as<double>()[i] = v; break;
      case DType::Float16: as<Half>()[i] = float_to_half(static_cast<float>(v)); break;
      case DType::BFloat16: as<BFloat16>()[i] = float_to_bfloat16(static_cast<float>(v)); break;
      case DType::Int64: as<int64_t>()[i] = static_cast<int64_t>(v); break;
      case DType::Int32: as<int32_t>()[i] = static_cast<int32_t>(v); break;
      case DType::UInt8: as<uint8_t>()[i] = static_cast<uint8_t>(v); break;
    }
  }

  double get(int64_t i) {
    switch (dtype) {
      case DType::Float32: return as<float>()[i];
      case DType::Float64: return as<double>()[i];
      case DType::Float16: return half_to_float(as<Half>()[i]);
      case DType::BFloat16: return bfloat16_to_float(as<BFloat16>()[i]);
      case DType::Int64: return static_cast<double>(as<int64_t>()[i]);
      case DType::Int32: return as<int32_t>()[i];
      case DType::UInt8: return as<uint8_t>()[i];
    }
    return 0;
  }
};

// Values exact in every dtype, uint8 and bfloat16 (8 significant bits) included.
const double kExactValues[] = {0, 1, 2, 3, 5, 7, 10, 42, 100, 127, 200, 255};

TEST(CopyCpu, EveryDTypePairContiguous) {
  const int64_t n = std::size(kExactValues);
  for (DType from : kAllDTypes) {
    for (DType to : kAllDTypes) {
      Buffer src(from, n), dst(to, n);
      for (int64_t i = 0; i < n; ++i) src.set(i, kExactValues[i]);
      const Layout l = contiguous({n});
      copy_cpu(src.data(), from, l, dst.data(), to, l);
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_EQ(dst.get(i), kExactValues[i]) << from << " -> " << to << " at " << i;
      }
    }
  }
}

// Every pair through the strided path: src is a transposed (3, 4) view, dst a padded (3, 4) view.
TEST(CopyCpu, EveryDTypePairStrided) {
  const Layout src_layout = make_layout({3, 4}, {1, 3});  // transpose of a contiguous (4, 3)
  const Layout dst_layout = make_layout({3, 4}, {6, 1});  // rows padded to 6
  for (DType from : kAllDTypes) {
    for (DType to : kAllDTypes) {
      Buffer src(from, 12), dst(to, 18);
      for (int64_t i = 0; i < 12; ++i) src.set(i, kExactValues[i]);
      for (int64_t i = 0; i < 18; ++i) dst.set(i, 99);
      copy_cpu(src.data(), from, src_layout, dst.data(), to, dst_layout);
      for (int64_t r = 0; r < 3; ++r) {
        for (int64_t c = 0; c < 4; ++c) {
          EXPECT_EQ(dst.get(r * 6 + c), kExactValues[c * 3 + r]) << from << " -> " << to << " at " << r << "," << c;
        }
        EXPECT_EQ(dst.get(r * 6 + 4), 99) << "padding overwritten";
        EXPECT_EQ(dst.get(r * 6 + 5), 99) << "padding overwritten";
      }
    }
  }
}

// Copies src into dst with the given layouts and checks every element against offset_of.
void check_strided(DType from, DType to, const Layout& src_layout, const Layout& dst_layout) {
  Buffer src(from, extent(src_layout)), dst(to, extent(dst_layout));
  for (int64_t i = 0; i < src.size(); ++i) src.set(i, static_cast<double>((i * 37) % 251));
  for (int64_t i = 0; i < dst.size(); ++i) dst.set(i, -1);
  copy_cpu(src.data(), from, src_layout, dst.data(), to, dst_layout);
  const int64_t n = src_layout.numel();
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double want = src.get(src_layout.offset_of(i)), got = dst.get(dst_layout.offset_of(i));
    if (got != want && ++mismatches <= 5) ADD_FAILURE() << "element " << i << ": want " << want << " got " << got;
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(CopyCpu, PermutedFourDimensional) {
  // src: a (5, 3, 7, 2) view of contiguous (7, 2, 5, 3) storage with dims permuted.
  const Layout src_layout = make_layout({5, 3, 7, 2}, {3, 1, 30, 15});
  check_strided(DType::Float32, DType::Float32, src_layout, contiguous({5, 3, 7, 2}));
  check_strided(DType::Float32, DType::Float64, src_layout, contiguous({5, 3, 7, 2}));
  check_strided(DType::Int32, DType::Float16, src_layout, contiguous({5, 3, 7, 2}));
}

TEST(CopyCpu, BroadcastSource) {
  // expand: a (1, 7) row to (5, 7) and a (5, 1) column to (5, 7) via stride 0.
  check_strided(DType::Float32, DType::Float32, make_layout({5, 7}, {0, 1}), contiguous({5, 7}));
  check_strided(DType::Float64, DType::Float32, make_layout({5, 7}, {1, 0}), contiguous({5, 7}));
  check_strided(DType::Float32, DType::Float32, make_layout({4, 3, 6}, {0, 0, 0}), contiguous({4, 3, 6}));
}

TEST(CopyCpu, StridedDestinationAndSizeOneDims) {
  check_strided(DType::Float32, DType::Float32, contiguous({4, 1, 6}), make_layout({4, 1, 6}, {1, 100, 4}));
  check_strided(DType::UInt8, DType::Float64, contiguous({1, 1, 9}), make_layout({1, 1, 9}, {0, 3, 2}));
}

TEST(CopyCpu, LargeStridedCopiesUseTheParallelPathCorrectly) {
  // 300 x 257 = 77100 elements, above the 32768-element parallel threshold; runs split mid-row.
  check_strided(DType::Float32, DType::Float32, make_layout({300, 257}, {1, 300}), contiguous({300, 257}));
  check_strided(DType::Float64, DType::BFloat16, make_layout({300, 257}, {1, 300}), contiguous({300, 257}));
  check_strided(DType::Float32, DType::Float32, make_layout({3, 70001}, {70001 * 2, 2}), contiguous({3, 70001}));
}

TEST(CopyCpu, LargeContiguousCopyAndCast) {
  const int64_t n = 100003;
  Buffer src(DType::Float32, n), same(DType::Float32, n), wide(DType::Float64, n);
  for (int64_t i = 0; i < n; ++i) src.set(i, i * 0.5 - 7.25);
  const Layout l = contiguous({n});
  copy_cpu(src.data(), DType::Float32, l, same.data(), DType::Float32, l);
  copy_cpu(src.data(), DType::Float32, l, wide.data(), DType::Float64, l);
  EXPECT_EQ(std::memcmp(src.data(), same.data(), src.bytes.size()), 0);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(wide.get(i), i * 0.5 - 7.25) << i;
}

TEST(CopyCpu, EmptyAndScalar) {
  float in = 3.5f, out = 0;
  copy_cpu(nullptr, DType::Float32, contiguous({0, 5}), nullptr, DType::Float32, contiguous({0, 5}));
  Layout scalar;  // ndim 0: one element
  double wide = 0;
  copy_cpu(&in, DType::Float32, scalar, &wide, DType::Float64, scalar);
  EXPECT_EQ(wide, 3.5);
  copy_cpu(&in, DType::Float32, contiguous({1}), &out, DType::Float32, contiguous({1}));
  EXPECT_EQ(out, 3.5f);
}

// One value through copy_cpu, src_dtype -> dst_dtype, returned as the raw destination type.
template <typename Dst, typename Src>
Dst convert_one(Src value, DType from, DType to) {
  Dst out{};
  copy_cpu(&value, from, contiguous({1}), &out, to, contiguous({1}));
  return out;
}

uint16_t to_half_bits(float v) { return convert_one<Half>(v, DType::Float32, DType::Float16).bits; }
uint16_t to_bf16_bits(float v) { return convert_one<BFloat16>(v, DType::Float32, DType::BFloat16).bits; }

TEST(CopyCpu, HalfRoundsToNearestEven) {
  EXPECT_EQ(to_half_bits(1.0f), 0x3C00);
  EXPECT_EQ(to_half_bits(-2.0f), 0xC000);
  EXPECT_EQ(to_half_bits(-0.0f), 0x8000);
  EXPECT_EQ(to_half_bits(0.1f), 0x2E66);
  EXPECT_EQ(to_half_bits(65504.0f), 0x7BFF);                  // largest half
  EXPECT_EQ(to_half_bits(65519.0f), 0x7BFF);                  // below the tie with 65536
  EXPECT_EQ(to_half_bits(65520.0f), 0x7C00);                  // tie rounds to even: overflow to Inf
  EXPECT_EQ(to_half_bits(1.0f + 0x1.0p-11f), 0x3C00);         // tie, even stays
  EXPECT_EQ(to_half_bits(1.0f + 3 * 0x1.0p-11f), 0x3C02);     // tie, odd rounds up
  EXPECT_EQ(to_half_bits(0x1.0p-24f), 0x0001);                // smallest subnormal
  EXPECT_EQ(to_half_bits(0x1.0p-25f), 0x0000);                // tie with zero -> zero
  EXPECT_EQ(to_half_bits(3 * 0x1.0p-26f), 0x0001);
  EXPECT_EQ(to_half_bits(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(to_half_bits(-std::numeric_limits<float>::infinity()), 0xFC00);
  const uint16_t nan = to_half_bits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);
}

TEST(CopyCpu, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(to_bf16_bits(1.0f), 0x3F80);
  EXPECT_EQ(to_bf16_bits(3.14159265f), 0x4049);
  EXPECT_EQ(to_bf16_bits(1.0f + 0x1.0p-8f), 0x3F80);       // tie, even stays
  EXPECT_EQ(to_bf16_bits(1.0f + 3 * 0x1.0p-8f), 0x3F82);   // tie, odd rounds up
  EXPECT_EQ(to_bf16_bits(std::numeric_limits<float>::max()), 0x7F80);  // rounds to Inf
  EXPECT_EQ(to_bf16_bits(-std::numeric_limits<float>::infinity()), 0xFF80);
  const uint16_t nan = to_bf16_bits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7F80, 0x7F80);
  EXPECT_NE(nan & 0x007F, 0);
  // Round trips back to float keep NaN and Inf.
  EXPECT_TRUE(std::isnan(convert_one<float>(BFloat16{nan}, DType::BFloat16, DType::Float32)));
  EXPECT_EQ(convert_one<float>(Half{0x7C00}, DType::Float16, DType::Float32), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(convert_one<double>(Half{0x7E00}, DType::Float16, DType::Float64)));
}

TEST(CopyCpu, DoubleToHalfRoundsOnce) {
  // Just above a half tie; rounding to float first would land exactly on the tie and round down.
  EXPECT_EQ(convert_one<Half>(1.0 + 0x1.0p-11 + 0x1.0p-40, DType::Float64, DType::Float16).bits, 0x3C01);
  EXPECT_EQ(convert_one<Half>(1.0 + 0x1.0p-11, DType::Float64, DType::Float16).bits, 0x3C00);
  EXPECT_EQ(convert_one<BFloat16>(1.0 + 0x1.0p-8 + 0x1.0p-40, DType::Float64, DType::BFloat16).bits, 0x3F81);
  EXPECT_EQ(convert_one<BFloat16>(-(1.0 + 0x1.0p-8 + 0x1.0p-40), DType::Float64, DType::BFloat16).bits, 0xBF81);
  EXPECT_EQ(convert_one<Half>(1e300, DType::Float64, DType::Float16).bits, 0x7C00);
  EXPECT_EQ(convert_one<BFloat16>(1e300, DType::Float64, DType::BFloat16).bits, 0x7F80);
  EXPECT_EQ(convert_one<Half>(-1e-300, DType::Float64, DType::Float16).bits, 0x8000);
  // Integers round too: 2049 is a tie between 2048 and 2050 in half.
  EXPECT_EQ(convert_one<Half>(int32_t{2049}, DType::Int32, DType::Float16).bits, 0x6800);  // 2048
  EXPECT_EQ(convert_one<Half>(int32_t{2051}, DType::Int32, DType::Float16).bits, 0x6802);  // 2052
  EXPECT_EQ(convert_one<BFloat16>(int64_t{257}, DType::Int64, DType::BFloat16).bits, 0x4380);  // 256
}

TEST(CopyCpu, FloatToIntTruncatesAndSaturates) {
  EXPECT_EQ(convert_one<int32_t>(2.7f, DType::Float32, DType::Int32), 2);
  EXPECT_EQ(convert_one<int32_t>(-2.7f, DType::Float32, DType::Int32), -2);
  EXPECT_EQ(convert_one<int64_t>(-2.7, DType::Float64, DType::Int64), -2);
  EXPECT_EQ(convert_one<uint8_t>(255.9, DType::Float64, DType::UInt8), 255);
  EXPECT_EQ(convert_one<uint8_t>(300.0f, DType::Float32, DType::UInt8), 255);
  EXPECT_EQ(convert_one<uint8_t>(-0.5f, DType::Float32, DType::UInt8), 0);
  EXPECT_EQ(convert_one<uint8_t>(-5.0f, DType::Float32, DType::UInt8), 0);
  EXPECT_EQ(convert_one<int32_t>(1e10f, DType::Float32, DType::Int32), std::numeric_limits<int32_t>::max());
  EXPECT_EQ(convert_one<int32_t>(-1e10, DType::Float64, DType::Int32), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(convert_one<int32_t>(-2147483648.9, DType::Float64, DType::Int32), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(convert_one<int64_t>(std::numeric_limits<double>::infinity(), DType::Float64, DType::Int64),
            std::numeric_limits<int64_t>::max());
  EXPECT_EQ(convert_one<int64_t>(0x1.0p63f, DType::Float32, DType::Int64), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(convert_one<int64_t>(-0x1.0p63, DType::Float64, DType::Int64), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(convert_one<int32_t>(std::numeric_limits<float>::quiet_NaN(), DType::Float32, DType::Int32), 0);
  EXPECT_EQ(convert_one<uint8_t>(Half{0x7E00}, DType::Float16, DType::UInt8), 0);           // NaN
  EXPECT_EQ(convert_one<int32_t>(Half{0xFC00}, DType::Float16, DType::Int32), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(convert_one<int64_t>(BFloat16{0x4049}, DType::BFloat16, DType::Int64), 3);  // 3.140625
}

TEST(CopyCpu, IntegerConversionsWrapOrRound) {
  EXPECT_EQ(convert_one<uint8_t>(int32_t{300}, DType::Int32, DType::UInt8), 44);
  EXPECT_EQ(convert_one<uint8_t>(int32_t{-1}, DType::Int32, DType::UInt8), 255);
  EXPECT_EQ(convert_one<int32_t>((int64_t{1} << 32) + 5, DType::Int64, DType::Int32), 5);
  EXPECT_EQ(convert_one<int64_t>(uint8_t{200}, DType::UInt8, DType::Int64), 200);
  EXPECT_EQ(convert_one<float>((int64_t{1} << 24) + 1, DType::Int64, DType::Float32), 16777216.0f);
  EXPECT_EQ(convert_one<float>(0.1, DType::Float64, DType::Float32), 0.1f);
}

TEST(CopyCpu, FillEveryDType) {
  for (DType t : kAllDTypes) {
    for (int64_t n : {0, 1, 7, 100003}) {
      Buffer b(t, n + 1);
      b.set(n, 11);
      fill_cpu(b.data(), t, n, 3.0);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(b.get(i), 3.0) << t << " n=" << n << " i=" << i;
      EXPECT_EQ(b.get(n), 11) << "wrote past n";
    }
  }
  Half h{};
  fill_cpu(&h, DType::Float16, 1, 0.1);
  EXPECT_EQ(h.bits, 0x2E66);
  uint8_t u = 0;
  fill_cpu(&u, DType::UInt8, 1, 300.0);
  EXPECT_EQ(u, 255);
  int32_t i = 1;
  fill_cpu(&i, DType::Int32, 1, -7.9);
  EXPECT_EQ(i, -7);
}

TEST(CopyCpu, RejectsMismatchedLayouts) {
  float a[6] = {}, b[6] = {};
  EXPECT_THROW(copy_cpu(a, DType::Float32, contiguous({2, 3}), b, DType::Float32, contiguous({3, 2})), Error);
  EXPECT_THROW(copy_cpu(a, DType::Float32, contiguous({6}), b, DType::Float32, contiguous({2, 3})), Error);
  EXPECT_THROW(copy_cpu(a, DType::Float32, make_layout({2, 3}, {-1, 1}), b, DType::Float32, contiguous({2, 3})),
               Error);
  EXPECT_THROW(fill_cpu(a, DType::Float32, -1, 0.0), Error);
}

}  // namespace
}  // namespace dpe::kernels
