// core/kernels/offset_calc.h, on the host: the same code the CUDA copy and binary kernels run per element.
#include "core/kernels/offset_calc.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "tests/testing/kernel_test_util.h"

namespace dpe::kernels::detail {
namespace {

constexpr uint32_t kMaxNumerator = (uint32_t{1} << 31) - 1;

void expect_divides(uint32_t d, uint32_t n) {
  const FastDivmod f(d);
  ASSERT_EQ(f.div(n), n / d) << n << " / " << d << " (magic " << f.magic << ", shift " << f.shift << ")";
}

TEST(FastDivmod, EqualsDivisionForEveryKindOfDivisor) {
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (int k = 12; k <= 30; ++k) {
    for (int64_t delta : {-1, 0, 1}) divisors.push_back(static_cast<uint32_t>((int64_t{1} << k) + delta));
  }
  divisors.push_back(kMaxNumerator);
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) divisors.push_back(rng() % kMaxNumerator + 1);
  for (uint32_t d : divisors) {
    // Where the quotient changes (multiples of d and their neighbours), the top of the range, and random n.
    for (uint32_t n = 0; n < 64; ++n) expect_divides(d, n);
    for (uint64_t q : {uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{kMaxNumerator} / d}) {
      const uint64_t m = q * d;
      for (uint64_t n : {m - 1, m, m + 1}) {
        if (n <= kMaxNumerator) expect_divides(d, static_cast<uint32_t>(n));
      }
    }
    expect_divides(d, kMaxNumerator);
    expect_divides(d, kMaxNumerator - 1);
    for (int i = 0; i < 50; ++i) expect_divides(d, rng() % (kMaxNumerator + uint64_t{1}));
    if (HasFatalFailure()) return;
  }
}

// Every linear index of two operands: the calculator's offsets equal Layout::offset_of's.
void expect_matches_offset_of(const Layout& a, const Layout& b, int want_ndim) {
  OffsetCalc32<2> calc;
  const Layout* const operands[2] = {&a, &b};
  ASSERT_TRUE(make_offset_calc32(operands, &calc));
  EXPECT_EQ(calc.ndim, want_ndim);
  for (int64_t i = 0; i < a.numel(); ++i) {
    uint32_t off[2];
    calc.offsets(static_cast<uint32_t>(i), off);
    ASSERT_EQ(off[0], a.offset_of(i)) << "a at " << i;
    ASSERT_EQ(off[1], b.offset_of(i)) << "b at " << i;
  }
}

// Both of Divider's paths against plain division: 32-bit when 31 bits hold the limit and the divisor, int64
// beyond (a limit or a divisor of 2^31 and more).
TEST(Divider, EqualsDivisionOnBothSidesOfThirtyOneBits) {
  const int64_t two31 = int64_t{1} << 31;
  struct Case {
    int64_t d, limit;
    bool narrow;
  };
  for (const Case& c : {Case{1, 10, true}, Case{3, 1000, true}, Case{196, two31, true}, Case{two31 - 1, two31, true},
                        Case{7, two31 + 1, false}, Case{two31, int64_t{1} << 40, false},
                        Case{12345, int64_t{1} << 40, false}}) {
    const Divider div(c.d, c.limit);
    EXPECT_EQ(div.narrow, c.narrow) << c.d << " below " << c.limit;
    for (int64_t n : {int64_t{0}, int64_t{1}, c.d - 1, c.d, c.d + 1, 2 * c.d + 5, c.limit / 2, c.limit - 1}) {
      if (n < 0 || n >= c.limit) continue;
      EXPECT_EQ(div.div(n), n / c.d) << n << " / " << c.d << " below " << c.limit;
    }
  }
}

TEST(OffsetCalc32, MatchesOffsetOfOnTheAttentionsLayouts) {
  const int64_t B = 3, H = 4, T = 5, hd = 6;
  const Layout contiguous = make_layout({B, H, T, hd}, {H * T * hd, T * hd, hd, 1});
  // heads(): (B, T, H, hd) viewed as (B, H, T, hd), and a (T, hd) table broadcast over (B, H).
  const Layout permuted = make_layout({B, H, T, hd}, {T * H * hd, hd, H * hd, 1});
  const Layout table = make_layout({B, H, T, hd}, {0, 0, hd, 1});
  expect_matches_offset_of(permuted, table, 4);    // nothing merges: the permuted operand is contiguous nowhere
  expect_matches_offset_of(contiguous, table, 2);  // (B*H, T*hd) with strides (0, 1) for the table
  expect_matches_offset_of(contiguous, contiguous, 1);
  // narrow(-1, hd/2, hd/2) of a contiguous tensor, as rotate_half reads it, with size-1 dimensions.
  const Layout half = make_layout({B, 1, T, hd / 2}, {T * hd, 999, hd, 1});
  const Layout into = make_layout({B, 1, T, hd / 2}, {T * hd / 2, 0, hd / 2, 1});
  expect_matches_offset_of(half, into, 2);
  const Layout scalar = make_layout({}, {});
  expect_matches_offset_of(scalar, scalar, 1);
}

TEST(OffsetCalc32, RefusesWhatThirtyOneBitsDoNotHold) {
  OffsetCalc32<2> calc;
  const Layout big = make_layout({int64_t{1} << 31}, {1});
  const Layout* const too_many[2] = {&big, &big};
  EXPECT_FALSE(make_offset_calc32(too_many, &calc));
  const Layout small = make_layout({4, 8}, {8, 1});
  const Layout far = make_layout({4, 8}, {int64_t{1} << 30, 1});  // last row starts at 3 * 2^30
  const Layout* const too_far[2] = {&small, &far};
  EXPECT_FALSE(make_offset_calc32(too_far, &calc));
  const Layout pair = make_layout({2, 8}, {8, 1});
  const Layout largest = make_layout({2, 8}, {(int64_t{1} << 31) - 8, 1});  // last offset exactly 2^31 - 1
  const Layout* const fits[2] = {&pair, &largest};
  EXPECT_TRUE(make_offset_calc32(fits, &calc));
}

}  // namespace
}  // namespace dpe::kernels::detail
