#include "scatter_gather/chunking.h"

#include <gtest/gtest.h>

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
  EXPECT_EQ(compute_chunk_sizes(6, 3, SplitRule::Weighted, {0, 1, 1}), (Sizes{3, 3}));
  EXPECT_THROW(compute_chunk_sizes(6, 3, SplitRule::Weighted, {1, 1}), Error);
  EXPECT_THROW(compute_chunk_sizes(6, 2, SplitRule::Weighted, {0, 0}), Error);
  EXPECT_THROW(compute_chunk_sizes(6, 2, SplitRule::Weighted, {-1, 2}), Error);
}

TEST(ChunkingTest, BadArguments) {
  EXPECT_THROW(compute_chunk_sizes(-1, 2), Error);
  EXPECT_THROW(compute_chunk_sizes(4, 0), Error);
}

}  // namespace
}  // namespace dpe
