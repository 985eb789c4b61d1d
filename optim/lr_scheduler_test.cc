#include "optim/lr_scheduler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "core/error.h"
#include "core/ops.h"
#include "optim/sgd.h"
#include "tests/testing/golden.h"

namespace dpe::optim {
namespace {

// Two groups with lr 0.1 and 0.02, as gen_optim.py builds them.
struct TwoGroups {
  Tensor a = zeros({1}).set_requires_grad(true);
  Tensor b = zeros({1}).set_requires_grad(true);
  SGD opt{{a}, {.lr = 0.1}};
  TwoGroups() { opt.add_param_group({{b}, 0.02, {}}); }
};

void expect_matches(LRScheduler& sched, Optimizer& opt, const Tensor& expected) {
  std::vector<double> rows = expected.to_vector<double>();  // (13, 2)
  ASSERT_EQ(expected.shape(), (Shape{13, 2}));
  for (int s = 0; s < 13; ++s) {
    if (s > 0) sched.step();
    for (int gi = 0; gi < 2; ++gi) {
      // Same chain of double multiplications as PyTorch: exact.
      EXPECT_EQ(sched.get_last_lr()[gi], rows[2 * s + gi]) << "step " << s << " group " << gi;
      EXPECT_EQ(opt.param_groups()[gi].lr, rows[2 * s + gi]);
    }
  }
}

TEST(LRSchedulerTest, StepLRMatchesPyTorch) {
  testing::Golden g = testing::load_golden("optim");  // tests/golden/gen_optim.py
  TwoGroups t;
  StepLR sched(t.opt, 3, 0.5);
  expect_matches(sched, t.opt, g.tensor("steplr"));
}

TEST(LRSchedulerTest, MultiStepLRMatchesPyTorch) {
  testing::Golden g = testing::load_golden("optim");
  TwoGroups t;
  MultiStepLR sched(t.opt, {2, 5, 5, 9}, 0.3);
  expect_matches(sched, t.opt, g.tensor("multisteplr"));
}

TEST(LRSchedulerTest, CosineWithWarmupFollowsItsFormula) {
  TwoGroups t;
  const int64_t warmup = 4, total = 10;
  const double min_lr = 0.001;
  CosineWithWarmup sched(t.opt, warmup, total, min_lr);
  const double base[2] = {0.1, 0.02};
  for (int64_t s = 0; s <= 14; ++s) {
    if (s > 0) sched.step();
    for (int gi = 0; gi < 2; ++gi) {
      double expected;
      if (s < warmup) {
        expected = base[gi] * s / warmup;
      } else {
        double p = std::min(1.0, double(s - warmup) / double(total - warmup));
        expected = min_lr + (base[gi] - min_lr) * 0.5 * (1 + std::cos(std::numbers::pi * p));
      }
      EXPECT_NEAR(sched.get_last_lr()[gi], expected, 1e-15) << "step " << s;
    }
  }
  // Landmarks: 0 at the start, base at the end of warm-up, min_lr from total on.
  TwoGroups u;
  CosineWithWarmup s2(u.opt, warmup, total, min_lr);
  EXPECT_EQ(s2.get_last_lr()[0], 0.0);
  for (int i = 0; i < warmup; ++i) s2.step();
  EXPECT_DOUBLE_EQ(s2.get_last_lr()[0], 0.1);
  for (int i = warmup; i < total + 3; ++i) s2.step();
  EXPECT_DOUBLE_EQ(s2.get_last_lr()[0], min_lr);
  EXPECT_THROW(CosineWithWarmup(u.opt, 10, 10), Error);
}

}  // namespace
}  // namespace dpe::optim
