// Switching between DP and DDP between steps (DataParallel::set_mode) and ParallelMode::Auto: a run that
// switches trains as one that does not, and Auto keeps the faster mode.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "core/ops.h"
#include "engine/data_parallel.h"
#include "layers/activation.h"
#include "layers/batchnorm.h"
#include "layers/containers.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "tests/testing/devices.h"
#include "tests/testing/errors.h"

namespace dpe {
namespace {

using testing::cpu_devices;
using testing::error_of;

// With a BatchNorm: its running statistics must follow the switches too.
std::shared_ptr<nn::Module> make_net() {
  manual_seed(61);
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(6, 8), std::make_shared<nn::BatchNorm1d>(8), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(8, 3)});
}

Tensor mse(const Tensor& out, const Tensor& target) { return nn::functional::mse_loss(out, target); }

OptimizerFactory sgd() {
  return [](const std::vector<Tensor>& p) {
    return std::make_unique<optim::SGD>(p, optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  };
}

OptimizerFactory adamw() {
  return [](const std::vector<Tensor>& p) {
    return std::make_unique<optim::AdamW>(p, optim::AdamWOptions{.lr = 1e-2});
  };
}

// 6 steps on batches of 8 over 2 devices; `modes[s]` is the mode of step s (set_mode before it).
nn::StateDict train(const std::vector<ParallelMode>& modes, const OptimizerFactory& optimizer) {
  DataParallel dp(make_net(), {.device_ids = cpu_devices(2), .mode = modes[0]});
  dp.set_optimizer(optimizer);
  manual_seed(62);
  for (ParallelMode mode : modes) {
    dp.set_mode(mode);
    EXPECT_EQ(dp.mode(), mode);
    dp.train_step(randn({8, 6}), randn({8, 3}), mse);
    EXPECT_EQ(dp.last_step().mode, mode);
    EXPECT_EQ(dp.num_optimizers(), mode == ParallelMode::DDP ? 2u : 1u);
  }
  return dp.module().state_dict();
}

constexpr ParallelMode kDP = ParallelMode::DP, kDDP = ParallelMode::DDP;

// Even shards of a power-of-two batch: DP's full-batch loss and DDP's weighted shard losses give the same
// bits (every scaling is by a power of two), so with SGD the switched run is the unswitched one, bit for bit.
TEST(ModeSwitch, SwitchingBetweenStepsTrainsAsNotSwitchingBitForBitWithSgd) {
  const nn::StateDict want = train({kDDP, kDDP, kDDP, kDDP, kDDP, kDDP}, sgd());
  for (const auto& modes : {std::vector{kDP, kDP, kDDP, kDDP, kDP, kDP}, std::vector{kDDP, kDP, kDDP, kDP, kDDP, kDP}}) {
    const nn::StateDict got = train(modes, sgd());
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < got.size(); ++k) EXPECT_TRUE(equal(got[k].second, want[k].second)) << got[k].first;
  }
}

TEST(ModeSwitch, SwitchingBetweenStepsTrainsAsNotSwitchingWithAdamW) {
  const nn::StateDict want = train({kDP, kDP, kDP, kDP, kDP, kDP}, adamw());
  const nn::StateDict got = train({kDP, kDP, kDDP, kDDP, kDDP, kDP}, adamw());
  for (size_t k = 0; k < got.size(); ++k) {
    if (!is_floating_point(got[k].second.dtype())) continue;  // num_batches_tracked
    EXPECT_LE(max_abs_diff(got[k].second, want[k].second), 1e-6) << got[k].first;
  }
}

// A loss that sleeps on batches of `slow_rows` rows: DP computes the loss once on the whole batch (8 rows),
// DDP on each replica's shard (4), so either mode can be made the slower on purpose.
LossFn slow_loss(int64_t slow_rows) {
  return [slow_rows](const Tensor& out, const Tensor& target) {
    if (out.size(0) == slow_rows) std::this_thread::sleep_for(std::chrono::milliseconds(30));
    return mse(out, target);
  };
}

void expect_auto_picks(ParallelMode faster, int64_t slow_rows) {
  DataParallel dp(make_net(), {.device_ids = cpu_devices(2), .mode = ParallelMode::Auto});
  dp.set_optimizer(sgd());
  EXPECT_EQ(dp.mode(), kDP);  // measured first
  for (int step = 0; step < 10; ++step) dp.train_step(randn({8, 6}), randn({8, 3}), slow_loss(slow_rows));
  const auto& choice = dp.last_step().auto_mode;
  ASSERT_TRUE(choice.has_value() && choice->chosen.has_value());
  EXPECT_EQ(*choice->chosen, faster);
  EXPECT_EQ(dp.mode(), faster);
  EXPECT_EQ(dp.last_step().mode, faster);
  const double slower_ms = faster == kDP ? choice->ddp_step_ms : choice->dp_step_ms;
  const double faster_ms = faster == kDP ? choice->dp_step_ms : choice->ddp_step_ms;
  EXPECT_GT(slower_ms, faster_ms) << "dp " << choice->dp_step_ms << " ms, ddp " << choice->ddp_step_ms << " ms";
  EXPECT_GE(slower_ms, 30.0);
}

TEST(ModeSwitch, AutoKeepsDdpWhenDpIsMadeSlower) { expect_auto_picks(kDDP, 8); }

TEST(ModeSwitch, AutoKeepsDpWhenDdpIsMadeSlower) { expect_auto_picks(kDP, 4); }

TEST(ModeSwitch, AutoReportsWhileMeasuring) {
  DataParallel dp(make_net(), {.device_ids = cpu_devices(2), .mode = ParallelMode::Auto});
  dp.set_optimizer(sgd());
  dp.train_step(randn({8, 6}), randn({8, 3}), mse);
  ASSERT_TRUE(dp.last_step().auto_mode.has_value());
  EXPECT_FALSE(dp.last_step().auto_mode->chosen.has_value());
  EXPECT_EQ(dp.last_step().auto_mode->dp_step_ms, 0.0);  // the warm-up step is not counted
  DataParallel plain(make_net(), {.device_ids = cpu_devices(2)});
  plain.set_optimizer(sgd());
  plain.train_step(randn({8, 6}), randn({8, 3}), mse);
  EXPECT_FALSE(plain.last_step().auto_mode.has_value());
}

TEST(ModeSwitch, RefusesWhatItCannotSwitch) {
  DataParallel dp(make_net(), {.device_ids = cpu_devices(2)});
  EXPECT_NE(error_of([&] { dp.set_mode(ParallelMode::Auto); }).find("set_mode(auto): Auto is chosen at construction"),
            std::string::npos);
  {
    auto guard = dp.no_sync();
    EXPECT_NE(error_of([&] { dp.set_mode(kDDP); }).find("set_mode inside no_sync()"), std::string::npos);
  }
  EXPECT_NE(error_of([&] {
              DataParallel(make_net(), {.device_ids = cpu_devices(2), .mode = ParallelMode::Auto,
                                        .backend = CollectiveBackend::Mpi});
            }).find("mode auto switches modes, which is not supported across processes (backend 'mpi')"),
            std::string::npos);
  dp.set_mode(kDP);  // the same mode: nothing to do
  EXPECT_EQ(dp.mode(), kDP);
}

}  // namespace
}  // namespace dpe
