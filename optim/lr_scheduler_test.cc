#include "optim/lr_scheduler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "core/error.h"
#include "core/ops.h"
#include "optim/sgd.h"
#include "tests/testing/errors.h"
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

// set_last_epoch(t) = t step() calls, without the calls: exactly for CosineWithWarmup (what `dpe train
// --resume` uses), to the last bits for the chainable StepLR / MultiStepLR; later steps continue from there.
TEST(LRSchedulerTest, SetLastEpochJumpsToAStep) {
  for (int64_t t = 0; t <= 14; ++t) {
    TwoGroups a, b;
    CosineWithWarmup stepped(a.opt, 4, 10, 0.001), jumped(b.opt, 4, 10, 0.001);
    for (int64_t i = 0; i < t; ++i) stepped.step();
    jumped.set_last_epoch(t);
    EXPECT_EQ(jumped.last_epoch(), t);
    EXPECT_EQ(jumped.get_last_lr(), stepped.get_last_lr()) << "step " << t;
    EXPECT_EQ(b.opt.param_groups()[1].lr, a.opt.param_groups()[1].lr) << "step " << t;
    stepped.step();
    jumped.step();
    EXPECT_EQ(jumped.get_last_lr(), stepped.get_last_lr()) << "the step after " << t;
  }
  for (int64_t t = 0; t <= 12; ++t) {
    TwoGroups a, b, c, d;
    StepLR step_stepped(a.opt, 3, 0.5), step_jumped(b.opt, 3, 0.5);
    MultiStepLR multi_stepped(c.opt, {2, 5, 5, 9}, 0.3), multi_jumped(d.opt, {2, 5, 5, 9}, 0.3);
    for (int64_t i = 0; i < t; ++i) {
      step_stepped.step();
      multi_stepped.step();
    }
    step_jumped.set_last_epoch(t);
    multi_jumped.set_last_epoch(t);
    for (int gi = 0; gi < 2; ++gi) {
      EXPECT_NEAR(step_jumped.get_last_lr()[gi], step_stepped.get_last_lr()[gi], 1e-16) << "StepLR step " << t;
      EXPECT_NEAR(multi_jumped.get_last_lr()[gi], multi_stepped.get_last_lr()[gi], 1e-16) << "MultiStepLR " << t;
      EXPECT_EQ(d.opt.param_groups()[gi].lr, multi_jumped.get_last_lr()[gi]);
    }
  }
}

TEST(LRSchedulerTest, SetLastEpochCostsNothingForHugeStepsAndRefusesNegativeOnes) {
  TwoGroups t;
  CosineWithWarmup sched(t.opt, 4, 10, 0.001);
  sched.set_last_epoch(int64_t{1} << 62);  // a replay of this many steps would never end
  EXPECT_EQ(sched.get_last_lr()[0], 0.001);
  const std::string e = testing::error_of([&] { sched.set_last_epoch(-4); });
  EXPECT_NE(e.find("set_last_epoch(-4): expected a step count >= 0"), std::string::npos) << e;
  EXPECT_EQ(sched.last_epoch(), int64_t{1} << 62) << "a refused jump changes nothing";
}

}  // namespace
}  // namespace dpe::optim
