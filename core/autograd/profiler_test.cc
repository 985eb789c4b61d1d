#include "core/autograd/profiler.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "core/autograd/function.h"
#include "core/ops.h"

namespace dpe {
namespace {

using autograd::NodeTime;

const NodeTime* find(const std::vector<NodeTime>& table, const std::string& name) {
  for (const NodeTime& n : table) {
    if (n.name == name) return &n;
  }
  return nullptr;
}

// y = x * 2 through a node that sleeps `ms` in its backward.
Tensor slow_double(const Tensor& x, int ms) {
  Tensor out = (x * 2.0).detach();
  autograd::record(out, {x}, "SlowBackward", [ms](const Tensor& g) -> std::vector<Tensor> {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return {g * 2.0};
  });
  return out;
}

class BackwardProfileTest : public ::testing::Test {
 protected:
  void SetUp() override { autograd::clear_backward_profile(); }
  void TearDown() override {
    autograd::enable_backward_profile(false);
    autograd::clear_backward_profile();
  }
};

TEST_F(BackwardProfileTest, CountsEveryNodeOfEveryPassWhileOn) {
  Tensor w = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3}).set_requires_grad(true);
  sum(w * w).backward();  // off: not counted
  autograd::enable_backward_profile(true);
  for (int i = 0; i < 2; ++i) sum(w * w).backward();
  autograd::enable_backward_profile(false);
  sum(w * w).backward();

  std::vector<NodeTime> table = autograd::backward_profile();
  EXPECT_EQ(autograd::backward_profile_passes(), 2);
  ASSERT_EQ(table.size(), 3u);
  for (const char* name : {"SumBackward", "MulBackward", "AccumulateGrad"}) {
    const NodeTime* n = find(table, name);
    ASSERT_NE(n, nullptr) << name;
    EXPECT_EQ(n->calls, 2) << name;
    EXPECT_GE(n->ms, 0.0) << name;
  }
  autograd::clear_backward_profile();
  EXPECT_TRUE(autograd::backward_profile().empty());
  EXPECT_EQ(autograd::backward_profile_passes(), 0);
}

TEST_F(BackwardProfileTest, PutsTheSlowNodeFirstWithItsTime) {
  Tensor x = Tensor::from_vector(std::vector<float>{1, 2}, {2}).set_requires_grad(true);
  autograd::enable_backward_profile(true);
  sum(slow_double(x, 30) * x).backward();
  std::vector<NodeTime> table = autograd::backward_profile();
  ASSERT_FALSE(table.empty());
  EXPECT_EQ(table[0].name, "SlowBackward");
  EXPECT_EQ(table[0].calls, 1);
  EXPECT_GE(table[0].ms, 30.0);
  for (size_t i = 1; i < table.size(); ++i) EXPECT_LT(table[i].ms, table[0].ms) << table[i].name;
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{4, 8}));  // d/dx 2x * x = 4x: profiling changes nothing
}

TEST_F(BackwardProfileTest, MergesPassesOfConcurrentThreads) {
  autograd::enable_backward_profile(true);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([] {
      Tensor x = Tensor::from_vector(std::vector<float>{1, 2}, {2}).set_requires_grad(true);
      for (int i = 0; i < 10; ++i) sum(slow_double(x, 1)).backward();
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(autograd::backward_profile_passes(), 40);
  const std::vector<NodeTime> table = autograd::backward_profile();
  const NodeTime* slow = find(table, "SlowBackward");
  ASSERT_NE(slow, nullptr);
  EXPECT_EQ(slow->calls, 40);
  EXPECT_GE(slow->ms, 40.0);
}

}  // namespace
}  // namespace dpe
