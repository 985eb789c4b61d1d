#include "data/distributed_sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "tests/testing/errors.h"

namespace dpe::data {
namespace {

using dpe::testing::error_of;
using Indices = std::vector<int64_t>;

std::vector<Indices> all_ranks(int64_t len, DistributedSamplerOptions options) {
  std::vector<Indices> out;
  for (int64_t r = 0; r < options.num_replicas; ++r) {
    options.rank = r;
    out.push_back(DistributedSampler(len, options).indices());
  }
  return out;
}

// Inverts the strided split: padded[r + k * R] = ranks[r][k].
Indices interleave(const std::vector<Indices>& ranks) {
  const size_t R = ranks.size();
  Indices padded(R * ranks[0].size());
  for (size_t r = 0; r < R; ++r) {
    EXPECT_EQ(ranks[r].size(), ranks[0].size()) << "rank " << r;
    for (size_t k = 0; k < ranks[r].size(); ++k) padded[r + k * R] = ranks[r][k];
  }
  return padded;
}

bool is_permutation_of_range(Indices v) {
  std::sort(v.begin(), v.end());
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != static_cast<int64_t>(i)) return false;
  }
  return true;
}

// ---- The table (shuffle = false): PyTorch's DistributedSampler, index for index ----

struct Row {
  int64_t len;
  int64_t num_replicas;
  bool drop_last;
  int64_t num_samples;
  std::vector<Indices> per_rank;
};

class DistributedSamplerTableTest : public ::testing::TestWithParam<Row> {};

TEST_P(DistributedSamplerTableTest, MatchesPyTorch) {
  const Row& row = GetParam();
  ASSERT_EQ(static_cast<int64_t>(row.per_rank.size()), row.num_replicas);
  for (int64_t r = 0; r < row.num_replicas; ++r) {
    DistributedSampler sampler(row.len, {.num_replicas = row.num_replicas, .rank = r, .shuffle = false,
                                         .drop_last = row.drop_last});
    EXPECT_EQ(sampler.num_samples(), row.num_samples) << "rank " << r;
    EXPECT_EQ(sampler.total_size(), row.num_samples * row.num_replicas) << "rank " << r;
    EXPECT_EQ(sampler.indices(), row.per_rank[r]) << "rank " << r;
    sampler.set_epoch(5);  // the epoch only seeds the shuffle
    EXPECT_EQ(sampler.indices(), row.per_rank[r]) << "rank " << r << " epoch 5";
  }
}

INSTANTIATE_TEST_SUITE_P(
    PyTorchTable, DistributedSamplerTableTest,
    ::testing::Values(Row{10, 3, false, 4, {{0, 3, 6, 9}, {1, 4, 7, 0}, {2, 5, 8, 1}}},
                      Row{10, 3, true, 3, {{0, 3, 6}, {1, 4, 7}, {2, 5, 8}}},
                      Row{12, 4, false, 3, {{0, 4, 8}, {1, 5, 9}, {2, 6, 10}, {3, 7, 11}}},
                      Row{7, 2, false, 4, {{0, 2, 4, 6}, {1, 3, 5, 0}}},
                      Row{7, 2, true, 3, {{0, 2, 4}, {1, 3, 5}}},
                      Row{5, 4, true, 1, {{0}, {1}, {2}, {3}}},
                      Row{2, 5, false, 1, {{0}, {1}, {0}, {1}, {0}}},  // padding (3) > len (2)
                      Row{2, 5, true, 0, {{}, {}, {}, {}, {}}}),       // ceil((2 - 5) / 5) = ceil(-0.6) = 0
    [](const ::testing::TestParamInfo<Row>& info) {
      const Row& row = info.param;
      return "len" + std::to_string(row.len) + "_R" + std::to_string(row.num_replicas) +
             (row.drop_last ? "_drop_last" : "_pad");
    });

TEST(DistributedSamplerTest, EmptyDataset) {
  for (bool drop_last : {false, true}) {
    for (bool shuffle : {false, true}) {
      DistributedSampler sampler(0, {.num_replicas = 3, .rank = 1, .shuffle = shuffle, .drop_last = drop_last});
      EXPECT_EQ(sampler.num_samples(), 0);
      EXPECT_EQ(sampler.total_size(), 0);
      EXPECT_TRUE(sampler.indices().empty());
    }
  }
}

TEST(DistributedSamplerTest, Defaults) {
  DistributedSampler sampler(9, {.num_replicas = 2, .rank = 1});
  EXPECT_TRUE(sampler.options().shuffle);
  EXPECT_EQ(sampler.options().seed, 0u);
  EXPECT_FALSE(sampler.options().drop_last);
  EXPECT_EQ(sampler.epoch(), 0);
  EXPECT_EQ(sampler.dataset_size(), 9);
  sampler.set_epoch(7);
  EXPECT_EQ(sampler.epoch(), 7);
}

// ---- Shuffle ----

TEST(DistributedSamplerShuffleTest, RepeatedCallsGiveTheSameOrder) {
  DistributedSampler a(50, {.num_replicas = 3, .rank = 2, .seed = 11});
  DistributedSampler b(50, {.num_replicas = 3, .rank = 2, .seed = 11});
  a.set_epoch(4);
  b.set_epoch(4);
  EXPECT_EQ(a.indices(), a.indices());
  EXPECT_EQ(a.indices(), b.indices());
}

TEST(DistributedSamplerShuffleTest, RanksShareOnePaddedPermutation) {
  struct Case {
    int64_t len, R;
  };
  for (Case c : {Case{10, 3}, Case{7, 2}, Case{2, 5}, Case{1, 4}, Case{100, 7}, Case{13, 13}}) {
    SCOPED_TRACE("len " + std::to_string(c.len) + " R " + std::to_string(c.R));
    Indices padded = interleave(all_ranks(c.len, {.num_replicas = c.R, .seed = 3}));
    const int64_t total = static_cast<int64_t>(padded.size());
    ASSERT_EQ(total, (c.len + c.R - 1) / c.R * c.R);
    // The first len are one permutation; the padding repeats it from its start (several times if needed).
    EXPECT_TRUE(is_permutation_of_range(Indices(padded.begin(), padded.begin() + c.len)));
    for (int64_t i = c.len; i < total; ++i) EXPECT_EQ(padded[i], padded[i % c.len]) << "position " << i;
    // As a multiset: every index appears, ceil or floor of total / len times.
    for (int64_t v = 0; v < c.len; ++v) {
      int64_t n = std::count(padded.begin(), padded.end(), v);
      EXPECT_GE(n, total / c.len) << "index " << v;
      EXPECT_LE(n, (total + c.len - 1) / c.len) << "index " << v;
    }
  }
}

TEST(DistributedSamplerShuffleTest, DropLastReadsDistinctIndices) {
  Indices padded = interleave(all_ranks(10, {.num_replicas = 3, .seed = 3, .drop_last = true}));
  ASSERT_EQ(padded.size(), 9u);
  Indices sorted = padded;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "an index is read twice";
  EXPECT_GE(sorted.front(), 0);
  EXPECT_LT(sorted.back(), 10);
  // The same permutation as without drop_last, truncated.
  Indices full = interleave(all_ranks(10, {.num_replicas = 3, .seed = 3}));
  EXPECT_EQ(padded, Indices(full.begin(), full.begin() + 9));
}

TEST(DistributedSamplerShuffleTest, SlicesAreDisjointAndCoverWhenDivisible) {
  for (bool drop_last : {false, true}) {
    std::vector<Indices> ranks = all_ranks(12, {.num_replicas = 4, .seed = 9, .drop_last = drop_last});
    Indices all;
    for (const Indices& r : ranks) {
      EXPECT_EQ(r.size(), 3u);
      all.insert(all.end(), r.begin(), r.end());
    }
    EXPECT_TRUE(is_permutation_of_range(all)) << "drop_last " << drop_last;
  }
}

TEST(DistributedSamplerShuffleTest, EpochChangesTheOrder) {
  DistributedSampler sampler(100, {.num_replicas = 1, .rank = 0});
  Indices epoch0 = sampler.indices();
  sampler.set_epoch(1);
  Indices epoch1 = sampler.indices();
  EXPECT_NE(epoch0, epoch1);
  EXPECT_TRUE(is_permutation_of_range(epoch1));
  sampler.set_epoch(0);
  EXPECT_EQ(sampler.indices(), epoch0);  // back to epoch 0: the same order again
}

TEST(DistributedSamplerShuffleTest, SeedChangesTheOrder) {
  Indices seed1 = DistributedSampler(100, {.num_replicas = 1, .rank = 0, .seed = 1}).indices();
  Indices seed2 = DistributedSampler(100, {.num_replicas = 1, .rank = 0, .seed = 2}).indices();
  EXPECT_NE(seed1, seed2);
}

TEST(DistributedSamplerShuffleTest, IsANonTrivialPermutation) {
  Indices perm = DistributedSampler(100, {.num_replicas = 1, .rank = 0}).indices();
  ASSERT_EQ(perm.size(), 100u);
  EXPECT_TRUE(is_permutation_of_range(perm));
  Indices identity(100);
  std::iota(identity.begin(), identity.end(), int64_t{0});
  EXPECT_NE(perm, identity);
}

// ---- Caller errors ----

TEST(DistributedSamplerTest, BadArguments) {
  EXPECT_NE(error_of([] { DistributedSampler(10, {.num_replicas = 3, .rank = 3}); })
                .find("rank 3 is out of range for num_replicas 3; expected 0 <= rank < 3"),
            std::string::npos);
  EXPECT_NE(error_of([] { DistributedSampler(10, {.num_replicas = 3, .rank = -1}); })
                .find("rank -1 is out of range for num_replicas 3; expected 0 <= rank < 3"),
            std::string::npos);
  EXPECT_NE(error_of([] { DistributedSampler(10, {.num_replicas = 0, .rank = 0}); })
                .find("num_replicas 0 is invalid; expected num_replicas >= 1"),
            std::string::npos);
  EXPECT_NE(error_of([] { DistributedSampler(10, {.num_replicas = -2, .rank = 0}); }).find("num_replicas -2"),
            std::string::npos);
  EXPECT_NE(error_of([] { DistributedSampler(-1, {.num_replicas = 2, .rank = 0}); })
                .find("dataset size -1 is negative"),
            std::string::npos);
}

}  // namespace
}  // namespace dpe::data
