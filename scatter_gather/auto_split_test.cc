#include "scatter_gather/auto_split.h"

#include <gtest/gtest.h>

#include <numeric>

#include "tests/testing/errors.h"

namespace dpe {
namespace {

int64_t total(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

TEST(AutoSplit, StartsEvenAndAlwaysSumsToTheBatch) {
  AutoSplit split(3);
  EXPECT_EQ(split.sizes(9), (std::vector<int64_t>{3, 3, 3}));
  EXPECT_EQ(split.sizes(10), (std::vector<int64_t>{4, 3, 3}));
  EXPECT_EQ(split.sizes(2), (std::vector<int64_t>{1, 1, 0}));  // fewer samples than devices: no floor
  EXPECT_EQ(split.sizes(0), (std::vector<int64_t>{0, 0, 0}));
  for (int64_t b : {3, 7, 100, 1001}) EXPECT_EQ(total(split.sizes(b)), b) << b;
}

// Device 1 takes 3x as long per sample: after kEvery steps it gets a quarter of the batch.
TEST(AutoSplit, FollowsTheMeasuredSpeeds) {
  AutoSplit split(2);
  for (int step = 0; step < AutoSplit::kEvery; ++step) {
    const std::vector<int64_t> sizes = split.sizes(100);
    split.observe(sizes, {1.0 * sizes[0], 3.0 * sizes[1]});
  }
  EXPECT_NEAR(split.weights()[0], 0.75, 1e-9);
  EXPECT_NEAR(split.ms_per_sample()[1], 3.0, 1e-9);
  EXPECT_EQ(split.sizes(100), (std::vector<int64_t>{75, 25}));
}

// Every device keeps a sample, however slow: a device with none could never be measured again.
TEST(AutoSplit, KeepsTheMinimumChunk) {
  AutoSplit split(3);
  for (int step = 0; step < AutoSplit::kEvery; ++step) split.observe({10, 10, 10}, {1.0, 1.0, 10000.0});
  const std::vector<int64_t> sizes = split.sizes(20);
  EXPECT_GE(sizes[2], AutoSplit::kMinChunk);
  EXPECT_EQ(total(sizes), 20);
}

// Noise below the hysteresis moves nothing; devices without samples or time are not measured.
TEST(AutoSplit, IgnoresNoiseAndUnmeasuredDevices) {
  AutoSplit split(2);
  for (int step = 0; step < AutoSplit::kEvery; ++step) split.observe({50, 50}, {50.0, 51.0});
  EXPECT_EQ(split.weights(), (std::vector<double>{0.5, 0.5}));
  AutoSplit unmeasured(2);
  for (int step = 0; step < AutoSplit::kEvery; ++step) unmeasured.observe({50, 0}, {50.0, 0.0});
  EXPECT_EQ(unmeasured.weights(), (std::vector<double>{0.5, 0.5}));
  EXPECT_EQ(unmeasured.ms_per_sample()[1], 0.0);
}

TEST(AutoSplit, RefusesBadArguments) {
  EXPECT_NE(testing::error_of([] { AutoSplit(0); }).find("expected at least one device, got 0"), std::string::npos);
  AutoSplit split(2);
  EXPECT_NE(testing::error_of([&] { split.observe({1}, {1.0, 1.0}); }).find("1 sample counts and 2 times for 2 devices"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { split.sizes(-1); }).find("batch size -1 is negative"), std::string::npos);
}

}  // namespace
}  // namespace dpe
