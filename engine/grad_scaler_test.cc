// DataParallel with a GradScaler (set_grad_scaler, engine/loss_scaling.h): DP and DDP on two devices train
// like one device with the same scaler (within 1e-6) and report the same scales; an overflow on one replica
// skips the step on every replica and backs the scale off, the replicas staying bit-identical; the skip
// decision is combined over replicas even when their gradients differ (no_sync); the deterministic mode keeps
// its bits with a scaler.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd/function.h"
#include "core/ops.h"
#include "engine/data_parallel.h"
#include "layers/activation.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "tests/testing/devices.h"

namespace dpe {
namespace {

using testing::cpu_devices;

// Where the injected overflow happens: the backward of the replica on this device, while armed.
std::atomic<bool> overflow_armed{false};
const Device kOverflowDevice = Device::cpu(1);

class Mlp : public nn::Cloneable<Mlp> {
 public:
  Mlp() : Cloneable("Mlp") { reset(); }
  void reset() override {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(6, 16));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(16, 3));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = relu(fc1->forward(x));
    if (overflow_armed && x.device() == kOverflowDevice) {
      // An identity whose backward overflows: the gradient of fc1 becomes inf/NaN on this replica only.
      Tensor out = h.detach();
      autograd::record(out, {h}, "OverflowingBackward", [](const Tensor& g) -> std::vector<Tensor> {
        return {g * std::numeric_limits<double>::infinity()};
      });
      h = out;
    }
    return fc2->forward(h);
  }
  std::shared_ptr<nn::Linear> fc1, fc2;
};

Tensor loss_fn(const Tensor& out, const Tensor& target) { return nn::functional::mse_loss(out, target); }

OptimizerFactory sgd() {
  return [](const std::vector<Tensor>& p) {
    return std::make_unique<optim::SGD>(p, optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  };
}

// A small growth interval so that the scale grows within the test.
std::shared_ptr<optim::GradScaler> make_scaler() {
  return std::make_shared<optim::GradScaler>(optim::GradScalerOptions{.growth_interval = 2});
}

struct Training {
  std::vector<Tensor> params;
  std::vector<double> losses, scales;
  std::vector<bool> skipped;
  double final_scale = 0;
};

// 5 train_steps of batch 12 from seed 7; `scaler` null: none.
Training train(std::vector<Device> devices, ParallelMode mode, std::shared_ptr<optim::GradScaler> scaler,
          bool deterministic = false) {
  manual_seed(7);
  DataParallel dp(std::make_shared<Mlp>(), {.device_ids = devices, .mode = mode, .deterministic = deterministic});
  dp.set_optimizer(sgd());
  dp.set_grad_scaler(scaler);
  Training run;
  for (int step = 0; step < 5; ++step) {
    Tensor x = randn({12, 6}), y = randn({12, 3});
    run.losses.push_back(dp.train_step(x, y, loss_fn));
    run.scales.push_back(dp.last_step().loss_scale);
    run.skipped.push_back(dp.last_step().skipped_step);
  }
  run.params = dp.module().parameters();
  run.final_scale = scaler ? scaler->get_scale() : 1.0;
  return run;
}

void expect_close(const std::vector<Tensor>& got, const std::vector<Tensor>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t k = 0; k < got.size(); ++k) EXPECT_LE(max_abs_diff(got[k], want[k]), tol) << what << " parameter " << k;
}

void expect_equal(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t k = 0; k < got.size(); ++k) EXPECT_TRUE(equal(got[k], want[k])) << what << " parameter " << k;
}

std::vector<Tensor> clones(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) out.push_back(t.detach().clone());
  return out;
}

TEST(DataParallelGradScaler, TwoDevicesEqualOneDeviceWithTheSameScaler) {
  const Training one = train(cpu_devices(1), ParallelMode::DP, make_scaler());
  const Training unscaled = train(cpu_devices(1), ParallelMode::DP, nullptr);
  // 5 clean steps, growth_interval 2: the scale doubles after steps 2 and 4.
  EXPECT_EQ(one.scales, (std::vector<double>{65536, 65536, 131072, 131072, 262144}));
  EXPECT_EQ(one.final_scale, 262144.0);
  EXPECT_EQ(one.skipped, std::vector<bool>(5, false));
  // Power-of-two scales are exact: the scaled training is the unscaled one, and the loss is returned unscaled.
  expect_close(one.params, unscaled.params, 1e-6, "one device, scaled vs unscaled");
  for (size_t s = 0; s < one.losses.size(); ++s) EXPECT_NEAR(one.losses[s], unscaled.losses[s], 1e-6) << "step " << s;
  for (ParallelMode mode : {ParallelMode::DP, ParallelMode::DDP}) {
    const std::string what = mode_name(mode);
    const Training two = train(cpu_devices(2), mode, make_scaler());
    expect_close(two.params, one.params, 1e-6, what);
    for (size_t s = 0; s < one.losses.size(); ++s) EXPECT_NEAR(two.losses[s], one.losses[s], 1e-6) << what << " step " << s;
    EXPECT_EQ(two.scales, one.scales) << what;
    EXPECT_EQ(two.skipped, one.skipped) << what;
    EXPECT_EQ(two.final_scale, one.final_scale) << what;
  }
}

TEST(DataParallelGradScaler, AnOverflowOnOneReplicaSkipsTheStepEverywhere) {
  for (ParallelMode mode : {ParallelMode::DP, ParallelMode::DDP}) {
    const std::string what = mode_name(mode);
    manual_seed(7);
    DataParallel dp(std::make_shared<Mlp>(), {.device_ids = cpu_devices(2), .mode = mode});
    dp.set_optimizer(sgd());
    auto scaler = make_scaler();
    dp.set_grad_scaler(scaler);
    Tensor x = randn({12, 6}), y = randn({12, 3});
    dp.train_step(x, y, loss_fn);  // a clean step: momentum buffers exist, growth tracker 1
    ASSERT_FALSE(dp.last_step().skipped_step) << what;
    const size_t replicas = dp.num_optimizers();
    std::vector<std::vector<Tensor>> before;
    for (size_t r = 0; r < replicas; ++r) before.push_back(clones(dp.replica(r).parameters()));

    overflow_armed = true;
    const double loss = dp.train_step(x, y, loss_fn);
    overflow_armed = false;
    EXPECT_TRUE(std::isfinite(loss)) << what << ": the forward is finite, only the backward overflowed";
    EXPECT_TRUE(dp.last_step().skipped_step) << what;
    EXPECT_EQ(dp.last_step().loss_scale, 65536.0) << what;
    EXPECT_EQ(scaler->get_scale(), 32768.0) << what;
    EXPECT_EQ(scaler->growth_tracker(), 0) << what;
    for (size_t r = 0; r < replicas; ++r) {
      expect_equal(dp.replica(r).parameters(), before[r], what + " replica " + std::to_string(r) + " unchanged");
      expect_equal(dp.replica(r).parameters(), dp.replica(0).parameters(), what + " replica " + std::to_string(r));
    }

    dp.train_step(x, y, loss_fn);  // training goes on at the smaller scale
    EXPECT_FALSE(dp.last_step().skipped_step) << what;
    EXPECT_EQ(dp.last_step().loss_scale, 32768.0) << what;
    for (size_t r = 1; r < replicas; ++r) {
      expect_equal(dp.replica(r).parameters(), dp.replica(0).parameters(), what + " replica " + std::to_string(r));
    }
  }
}

// Under no_sync each replica keeps its own gradients: an inf in replica 1's alone must still stop replica 0.
TEST(DataParallelGradScaler, DdpCombinesTheFlagsOfEveryReplica) {
  manual_seed(7);
  DataParallel dp(std::make_shared<Mlp>(), {.device_ids = cpu_devices(3), .mode = ParallelMode::DDP});
  dp.set_optimizer(sgd());
  auto scaler = make_scaler();
  dp.set_grad_scaler(scaler);
  Tensor x = randn({12, 6}), y = randn({12, 3});
  dp.zero_grad();
  {
    NoSyncGuard no_sync(dp);
    dp.forward_backward(x, y, loss_fn);
  }
  std::vector<std::vector<Tensor>> before;
  for (size_t r = 0; r < 3; ++r) before.push_back(clones(dp.replica(r).parameters()));
  Tensor grad = dp.replica(1).parameters()[2].grad();  // fc2.weight's, replica 1's alone
  grad.fill_(std::numeric_limits<double>::infinity());
  dp.optimizer_step();
  EXPECT_TRUE(dp.last_step().skipped_step);
  EXPECT_EQ(scaler->get_scale(), 32768.0);
  for (size_t r = 0; r < 3; ++r) expect_equal(dp.replica(r).parameters(), before[r], "replica " + std::to_string(r));
}

// PyTorch's clipping recipe: unscale_ every optimizer, clip, step. optimizer_step must not unscale again.
std::vector<Tensor> train_clipped(std::vector<Device> devices, ParallelMode mode) {
  manual_seed(7);
  DataParallel dp(std::make_shared<Mlp>(), {.device_ids = devices, .mode = mode});
  dp.set_optimizer(sgd());
  auto scaler = make_scaler();
  dp.set_grad_scaler(scaler);
  for (int step = 0; step < 3; ++step) {
    Tensor x = randn({12, 6}), y = randn({12, 3});
    dp.zero_grad();
    dp.forward_backward(x, y, loss_fn);
    for (size_t r = 0; r < dp.num_optimizers(); ++r) {
      scaler->unscale_(dp.optimizer(r));
      optim::clip_grad_norm_(dp.replica(r).parameters(), 0.1);
    }
    dp.optimizer_step();
    EXPECT_FALSE(dp.last_step().skipped_step);
  }
  return dp.module().parameters();
}

TEST(DataParallelGradScaler, GradientsUnscaledByTheCallerAreNotUnscaledAgain) {
  const std::vector<Tensor> one = train_clipped(cpu_devices(1), ParallelMode::DP);
  // The same clipping on true gradients, without a scaler.
  manual_seed(7);
  DataParallel plain(std::make_shared<Mlp>(), {.device_ids = cpu_devices(1)});
  plain.set_optimizer(sgd());
  for (int step = 0; step < 3; ++step) {
    Tensor x = randn({12, 6}), y = randn({12, 3});
    plain.zero_grad();
    plain.forward_backward(x, y, loss_fn);
    optim::clip_grad_norm_(plain.module().parameters(), 0.1);
    plain.optimizer_step();
  }
  expect_close(one, plain.module().parameters(), 1e-6, "one device, clipped");
  for (ParallelMode mode : {ParallelMode::DP, ParallelMode::DDP}) {
    expect_close(train_clipped(cpu_devices(2), mode), one, 1e-6, mode_name(mode));
  }
}

TEST(DataParallelGradScaler, ADisabledScalerChangesNothing) {
  const Training plain = train(cpu_devices(2), ParallelMode::DDP, nullptr);
  const Training disabled =
      train(cpu_devices(2), ParallelMode::DDP, std::make_shared<optim::GradScaler>(optim::GradScalerOptions{.enabled = false}));
  expect_equal(disabled.params, plain.params, "disabled scaler");
  EXPECT_EQ(disabled.scales, std::vector<double>(5, 1.0));
}

// The deterministic mode's promise (the same bits for any device count and mode) holds with a scaler.
TEST(DataParallelGradScaler, DeterministicModeKeepsItsBits) {
  const Training dp2 = train(cpu_devices(2), ParallelMode::DP, make_scaler(), /*deterministic=*/true);
  const Training ddp3 = train(cpu_devices(3), ParallelMode::DDP, make_scaler(), /*deterministic=*/true);
  expect_equal(ddp3.params, dp2.params, "deterministic DDP on 3 vs DP on 2");
  EXPECT_EQ(ddp3.scales, dp2.scales);
}

}  // namespace
}  // namespace dpe
