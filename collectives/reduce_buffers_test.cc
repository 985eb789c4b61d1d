// The host reduction kernels against the formula they promise, bit for bit. Values with many significant
// bits and scales that are not powers of two make every rounding visible, and pieces that start at every
// offset within a cache line reach each part of the two-member pass (Note [Streaming the partner's sums]):
// the scalar head before the first 32-byte boundary, the vector body with its streamed stores, the tail.
#include "collectives/reduce_buffers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <type_traits>
#include <vector>

namespace dpe {
namespace {

template <typename T>
DType dtype_of() {
  return std::is_same_v<T, float> ? DType::Float32 : DType::Float64;
}

template <typename T>
std::vector<T> random_values(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<double> mantissa(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(std::ldexp(mantissa(rng), exponent(rng)));
  return v;
}

template <typename T>
void expect_two_member_sums_exact() {
  std::mt19937 rng(7);
  const T sa = static_cast<T>(0.3), sb = static_cast<T>(0.7);
  constexpr int64_t kPad = 16;  // untouched elements on each side of every output
  for (int64_t count : {0, 1, 7, 8, 9, 31, 100, 1027}) {
    for (int64_t offset = 0; offset < 16; ++offset) {  // 16 floats: every start within a 64-byte line
      for (size_t local : {0u, 1u}) {
        std::vector<T> a = random_values<T>(static_cast<size_t>(count + offset), rng);
        std::vector<T> b = random_values<T>(static_cast<size_t>(count + offset), rng);
        const T sentinel = static_cast<T>(-12345.0);
        std::vector<T> x(static_cast<size_t>(count + offset + 2 * kPad), sentinel), y = x;
        weighted_sum_buffers_cpu(dtype_of<T>(), {a.data() + offset, b.data() + offset}, {sa, sb},
                                 {x.data() + kPad + offset, y.data() + kPad + offset}, local, count);
        for (int64_t i = 0; i < static_cast<int64_t>(x.size()); ++i) {
          const int64_t k = i - kPad;  // index into a and b
          const T want = k >= offset && k < offset + count ? std::fma(sa, a[k], T(0)) + std::fma(sb, b[k], T(0))
                                                           : sentinel;
          ASSERT_EQ(x[i], want) << "count " << count << ", offset " << offset << ", local " << local << ", output 0 at "
                                << i;
          ASSERT_EQ(y[i], want) << "count " << count << ", offset " << offset << ", local " << local << ", output 1 at "
                                << i;
        }
      }
    }
  }
}

TEST(WeightedSumBuffersCpu, TwoMembersFloat32AtEveryAlignment) { expect_two_member_sums_exact<float>(); }
TEST(WeightedSumBuffersCpu, TwoMembersFloat64AtEveryAlignment) { expect_two_member_sums_exact<double>(); }

// DDP's in-place case: each member's output is its own input (an attached gradient in its bucket slot).
TEST(WeightedSumBuffersCpu, TwoMembersInPlace) {
  std::mt19937 rng(11);
  for (size_t local : {0u, 1u}) {
    std::vector<float> a = random_values<float>(1000, rng), b = random_values<float>(1000, rng);
    std::vector<float> want(a.size());
    for (size_t i = 0; i < a.size(); ++i) want[i] = std::fma(0.25f, a[i], 0.0f) + std::fma(0.75f, b[i], 0.0f);
    weighted_sum_buffers_cpu(DType::Float32, {a.data() + 3, b.data() + 3}, {0.25, 0.75}, {a.data() + 3, b.data() + 3},
                             local, 997);
    EXPECT_EQ(std::vector<float>(a.begin() + 3, a.end()), std::vector<float>(want.begin() + 3, want.end()));
    EXPECT_EQ(std::vector<float>(b.begin() + 3, b.end()), std::vector<float>(want.begin() + 3, want.end()));
  }
}

// More members: the sum in member order, every output alike whichever is local.
TEST(WeightedSumBuffersCpu, ThreeMembersSumInOrder) {
  std::mt19937 rng(13);
  const int64_t count = 5000;  // past one of the kernel's blocks
  std::vector<std::vector<float>> in(3);
  for (auto& v : in) v = random_values<float>(count, rng);
  const std::vector<double> scales = {0.1, 0.2, 0.7};
  std::vector<float> want(count);
  for (int64_t i = 0; i < count; ++i) {
    float acc = std::fma(0.1f, in[0][i], 0.0f);
    acc += std::fma(0.2f, in[1][i], 0.0f);
    acc += std::fma(0.7f, in[2][i], 0.0f);
    want[i] = acc;
  }
  std::vector<std::vector<float>> out(3, std::vector<float>(count));
  weighted_sum_buffers_cpu(DType::Float32, {in[0].data(), in[1].data(), in[2].data()}, scales,
                           {out[0].data(), out[1].data(), out[2].data()}, 2, count);
  for (const auto& o : out) EXPECT_EQ(o, want);
}

}  // namespace
}  // namespace dpe
