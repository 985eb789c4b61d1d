#include "scatter_gather/chunking.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>

#include "core/error.h"

namespace dpe {
namespace {

using Sizes = std::vector<int64_t>;

TEST(ChunkingTest, PyTorchChunkRule) {
  EXPECT_EQ(compute_chunk_sizes(5, 3), (Sizes{2, 2, 1}));
  EXPECT_EQ(compute_chunk_sizes(4, 3), (Sizes{2, 2}));  // fewer chunks than devices
  EXPECT_EQ(compute_chunk_sizes(9, 4), (Sizes{3, 3, 3}));
  EXPECT_EQ(compute_chunk_sizes(10, 4), (Sizes{3, 3, 3, 1}));
  EXPECT_EQ(compute_chunk_sizes(36, 7), (Sizes{6, 6, 6, 6, 6, 6}));
  EXPECT_EQ(compute_chunk_sizes(2, 4), (Sizes{1, 1}));
  EXPECT_EQ(compute_chunk_sizes(1, 8), (Sizes{1}));
  EXPECT_EQ(compute_chunk_sizes(0, 3), (Sizes{0}));
  EXPECT_EQ(compute_chunk_sizes(7, 1), (Sizes{7}));
}

TEST(ChunkingTest, BalancedRule) {
  EXPECT_EQ(compute_chunk_sizes(4, 3, SplitRule::Balanced), (Sizes{2, 1, 1}));
  EXPECT_EQ(compute_chunk_sizes(10, 4, SplitRule::Balanced), (Sizes{3, 3, 2, 2}));
  EXPECT_EQ(compute_chunk_sizes(9, 4, SplitRule::Balanced), (Sizes{3, 2, 2, 2}));
  EXPECT_EQ(compute_chunk_sizes(2, 4, SplitRule::Balanced), (Sizes{1, 1}));  // B < n: devices left idle
}

TEST(ChunkingTest, WeightedRule) {
  EXPECT_EQ(compute_chunk_sizes(10, 2, SplitRule::Weighted, {3, 1}), (Sizes{8, 2}));  // 7.5 / 2.5: tie to lower index
  EXPECT_EQ(compute_chunk_sizes(9, 3, SplitRule::Weighted, {1, 1, 1}), (Sizes{3, 3, 3}));
  // A zero share keeps its device's place; only trailing empty chunks are dropped.
  EXPECT_EQ(compute_chunk_sizes(6, 3, SplitRule::Weighted, {0, 1, 1}), (Sizes{0, 3, 3}));
  EXPECT_EQ(compute_chunk_sizes(4, 3, SplitRule::Weighted, {3, 0, 1}), (Sizes{3, 0, 1}));
  EXPECT_EQ(compute_chunk_sizes(7, 3, SplitRule::Weighted, {1, 1, 10}), (Sizes{1, 0, 6}));
  EXPECT_EQ(compute_chunk_sizes(6, 3, SplitRule::Weighted, {1, 1, 0}), (Sizes{3, 3}));
  EXPECT_EQ(chunk_offsets({3, 0, 1}), (Sizes{0, 3, 3}));
  EXPECT_THROW(compute_chunk_sizes(6, 3, SplitRule::Weighted, {1, 1}), Error);
  EXPECT_THROW(compute_chunk_sizes(6, 2, SplitRule::Weighted, {0, 0}), Error);
  EXPECT_THROW(compute_chunk_sizes(6, 2, SplitRule::Weighted, {-1, 2}), Error);
}

TEST(ChunkingTest, BadArguments) {
  EXPECT_THROW(compute_chunk_sizes(-1, 2), Error);
  EXPECT_THROW(compute_chunk_sizes(4, 0), Error);
}

// The message of the dpe::Error that f throws ("" when it throws none).
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();  // 9223372036854775807 = 3 * 3074457345618258602 + 1

// Every rule's invariants: sizes positive (or the single 0 of an empty batch), at most one per device,
// summing to the batch.
// weighted: a chunk before the last may be empty (its device keeps its place); the last one never is.
void expect_valid_split(const Sizes& sizes, int64_t batch, int64_t devices, const std::string& what,
                        bool weighted = false) {
  ASSERT_FALSE(sizes.empty()) << what;
  ASSERT_LE(static_cast<int64_t>(sizes.size()),
            weighted ? devices : std::max<int64_t>(std::min(batch, devices), 1)) << what;
  EXPECT_TRUE(sizes.back() > 0 || (batch == 0 && sizes.size() == 1)) << what << ": last size " << sizes.back();
  int64_t sum = 0;
  for (int64_t s : sizes) {
    EXPECT_TRUE(s > 0 || weighted || (batch == 0 && sizes.size() == 1)) << what << ": size " << s;
    ASSERT_LE(s, batch - sum) << what << ": sizes add up to more than the batch";
    sum += s;
  }
  EXPECT_EQ(sum, batch) << what;
}

// A batch of INT64_MAX once overflowed ceil(B/n) = (B + n - 1) / n to a negative chunk, then pushed INT64_MAX
// chunks of size 1 (memory without end); the weighted rule converted 2^63 to int64 (undefined).
TEST(ChunkingTest, BatchNearInt64MaxDoesNotOverflow) {
  EXPECT_EQ(compute_chunk_sizes(kMax, 3), (Sizes{3074457345618258603, 3074457345618258603, 3074457345618258601}));
  EXPECT_EQ(compute_chunk_sizes(kMax, 3, SplitRule::Balanced),
            (Sizes{3074457345618258603, 3074457345618258602, 3074457345618258602}));
  EXPECT_EQ(compute_chunk_sizes(kMax, 1), (Sizes{kMax}));
  EXPECT_EQ(compute_chunk_sizes(kMax, 2), (Sizes{4611686018427387904, 4611686018427387903}));
  EXPECT_EQ(compute_chunk_sizes(kMax, 1, SplitRule::Weighted, {2.5}), (Sizes{kMax}));
  for (const std::vector<double>& w : std::vector<std::vector<double>>{
           {1, 1, 1}, {1, 2, 3}, {0, 1, 1}, {1e-300, 1e-300, 1e-300}, {1e308, 1e308, 1e308}, {1, 0, 1e300}}) {
    const Sizes sizes = compute_chunk_sizes(kMax, 3, SplitRule::Weighted, w);
    const std::string what = "weights " + std::to_string(w[0]) + "," + std::to_string(w[1]) + "," +
                             std::to_string(w[2]);
    expect_valid_split(sizes, kMax, 3, what, /*weighted=*/true);
  }
  // Equal weights: equal shares to within the double rounding of 2^63 / 3 (ulp 512).
  for (int64_t s : compute_chunk_sizes(kMax, 3, SplitRule::Weighted, {1, 1, 1})) {
    EXPECT_LE(std::abs(s - kMax / 3), 2048) << s;
  }
  // A zero weight gets nothing, however large the leftover after rounding.
  EXPECT_EQ(compute_chunk_sizes(kMax, 3, SplitRule::Weighted, {0, 1, 1})[0], 0);
  EXPECT_EQ(compute_chunk_sizes(kMax, 3, SplitRule::Weighted, {0, 0, 7}), (Sizes{0, 0, kMax}));
}

// Sizes are at most min(batch, devices) entries long: a huge device count with a small batch allocates
// nothing more (Balanced once pushed one entry per device, empty ones included, before dropping them).
TEST(ChunkingTest, HugeDeviceCountAllocatesOnlyWhatIsUsed) {
  EXPECT_EQ(compute_chunk_sizes(5, kMax), (Sizes{1, 1, 1, 1, 1}));
  EXPECT_EQ(compute_chunk_sizes(5, kMax, SplitRule::Balanced), (Sizes{1, 1, 1, 1, 1}));
  EXPECT_EQ(compute_chunk_sizes(0, kMax, SplitRule::Balanced), (Sizes{0}));
  EXPECT_EQ(compute_chunk_sizes(3, kMax, SplitRule::Chunk), (Sizes{1, 1, 1}));
}

TEST(ChunkingTest, BadWeightsNameTheWeight) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_NE(error_of([&] { compute_chunk_sizes(6, 2, SplitRule::Weighted, {1, nan}); })
                .find("weight 1 is nan; expected a finite non-negative number"),
            std::string::npos);
  EXPECT_NE(error_of([&] { compute_chunk_sizes(6, 2, SplitRule::Weighted, {inf, 1}); }).find("weight 0 is inf"),
            std::string::npos);
  EXPECT_NE(error_of([&] { compute_chunk_sizes(6, 2, SplitRule::Weighted, {1, -inf}); }).find("weight 1 is -inf"),
            std::string::npos);
  EXPECT_NE(error_of([&] { compute_chunk_sizes(6, 2, SplitRule::Weighted, {-0.5, 2}); }).find("weight 0 is -0.5"),
            std::string::npos);
  EXPECT_NE(error_of([&] { compute_chunk_sizes(6, 3, SplitRule::Weighted, {0, 0, 0}); }).find("sum to 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] { compute_chunk_sizes(6, 2, SplitRule::Weighted, {-0.0, 0.0}); }).find("sum to 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] { compute_chunk_sizes(6, 3, SplitRule::Weighted, {1, 1}); }).find("2 weights for 3 devices"),
            std::string::npos);
  EXPECT_NE(error_of([&] { compute_chunk_sizes(kMax, 3, SplitRule::Weighted, {}); }).find("0 weights for 3 devices"),
            std::string::npos);
  EXPECT_NE(error_of([&] { compute_chunk_sizes(std::numeric_limits<int64_t>::min(), 3); }).find("is negative"),
            std::string::npos);
  EXPECT_NE(error_of([&] { compute_chunk_sizes(3, -kMax); }).find("at least one device"), std::string::npos);
  // Sums that overflow to inf and denormal weights are valid weights.
  EXPECT_EQ(compute_chunk_sizes(10, 2, SplitRule::Weighted, {1.5e308, 1.5e308}), (Sizes{5, 5}));
  EXPECT_EQ(compute_chunk_sizes(10, 2, SplitRule::Weighted, {5e-324, 5e-324}), (Sizes{5, 5}));
  EXPECT_EQ(compute_chunk_sizes(10, 2, SplitRule::Weighted, {3e300, 1e300}), (Sizes{8, 2}));
}

// Random batches across the whole int64 range, every rule: the invariants hold.
TEST(ChunkingTest, RandomBatchesKeepTheInvariants) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 3000; ++trial) {
    const int bits = static_cast<int>(rng() % 64);
    const int64_t batch = bits == 0 ? 0 : static_cast<int64_t>(rng() >> (64 - bits)) & kMax;
    const int64_t devices = 1 + static_cast<int64_t>(rng() % 9);
    std::vector<double> w(devices);
    for (double& x : w) x = (rng() % 4 == 0) ? 0.0 : std::ldexp(static_cast<double>(rng() % 1000 + 1), int(rng() % 40) - 20);
    if (std::all_of(w.begin(), w.end(), [](double x) { return x == 0; })) w[0] = 1;
    for (SplitRule rule : {SplitRule::Chunk, SplitRule::Balanced, SplitRule::Weighted}) {
      const std::string what = split_rule_name(rule) + " batch " + std::to_string(batch) + " devices " +
                               std::to_string(devices);
      expect_valid_split(compute_chunk_sizes(batch, devices, rule, w), batch, devices, what,
                         rule == SplitRule::Weighted);
    }
  }
}

}  // namespace
}  // namespace dpe
