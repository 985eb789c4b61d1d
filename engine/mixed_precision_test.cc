// Mixed precision in the engine: a caller's autocast scope covers DP's and DDP's device workers, so bfloat16
// training is the same in both modes and on one device (within the stated tolerance); DDP replicas stay bit
// for bit identical; DDP's bfloat16 bucket all-reduce (reduce_dtype).
#include <gtest/gtest.h>

#include "core/amp/autocast.h"
#include "core/autograd/grad_mode.h"
#include "core/ops.h"
#include "engine/data_parallel.h"
#include "layers/activation.h"
#include "layers/containers.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "optim/sgd.h"
#include "tests/testing/compare.h"
#include "tests/testing/devices.h"
#include "tests/testing/errors.h"

namespace dpe {
namespace {

using testing::cpu_devices;
using testing::max_relative_diff;

std::shared_ptr<nn::Module> mlp() {
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(20, 64), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(64, 64),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(64, 5)});
}

Tensor mse(const Tensor& out, const Tensor& target) { return nn::functional::mse_loss(out, target); }

OptimizerFactory sgd() {
  return [](const std::vector<Tensor>& params) { return std::make_unique<optim::SGD>(params, optim::SGDOptions{.lr = 0.05}); };
}

// Five SGD steps of `model` (a copy) on fixed batches, each step under a CPU bfloat16 guard when `bf16`.
struct TrainedRun {
  std::vector<Tensor> params;
  std::vector<double> losses;
};

TrainedRun train(const nn::Module& model, DataParallelOptions options, bool bf16) {
  DataParallel dp(nn::clone_module(model, Device::cpu(0)), options);
  dp.set_optimizer(sgd());
  TrainedRun run;
  Generator gen(7);
  for (int step = 0; step < 5; ++step) {
    Tensor x = randn({24, 20}, {}, &gen), y = randn({24, 5}, {}, &gen);
    std::optional<amp::AutocastGuard> autocast;
    if (bf16) autocast.emplace(DeviceKind::CPU, DType::BFloat16);
    run.losses.push_back(dp.train_step(x, y, mse));
  }
  // DP: the master's (its other replicas are refreshed at the next forward); DDP: the last replica's.
  const size_t replica = options.mode == ParallelMode::DDP ? dp.device_ids().size() - 1 : 0;
  for (const Tensor& p : dp.replica(replica).parameters()) run.params.push_back(p.detach().clone());
  return run;
}

double max_param_diff(const TrainedRun& a, const TrainedRun& b) {
  double worst = 0;
  for (size_t k = 0; k < a.params.size(); ++k) worst = std::max(worst, max_relative_diff(a.params[k], b.params[k]));
  return worst;
}

#define SKIP_WITHOUT_BF16()                                                                                  \
  if (!amp::cpu_supports_bf16()) GTEST_SKIP() << "this CPU has no bfloat16 instructions: CPU autocast stays " \
                                                 "float32 (core/amp/autocast.h), nothing to compare"

// Tolerance: each product reads the same bfloat16 casts in every configuration; what differs is float32
// summation order (a batch split over devices, gradients summed across replicas), ~1e-7 relative, and where
// such a difference meets a bfloat16 rounding boundary of a backward operand it moves that element by 2^-8.
// Over five steps that stays far below the distance between bfloat16 and float32 training, which the test
// also checks (so an autocast that did not reach the workers would fail).
TEST(MixedPrecisionTest, Bf16TrainingIsTheSameInDpDdpAndOnOneDevice) {
  SKIP_WITHOUT_BF16();
  manual_seed(3);
  auto model = mlp();
  const TrainedRun single = train(*model, {.device_ids = cpu_devices(1)}, true);
  const TrainedRun dp = train(*model, {.device_ids = cpu_devices(2)}, true);
  const TrainedRun ddp = train(*model, {.device_ids = cpu_devices(3), .mode = ParallelMode::DDP}, true);
  const TrainedRun fp32 = train(*model, {.device_ids = cpu_devices(2)}, false);
  const double bf16_vs_fp32 = max_param_diff(single, fp32);
  EXPECT_GT(bf16_vs_fp32, 1e-4) << "autocast had no effect";
  EXPECT_LT(max_param_diff(dp, single), 1e-3) << "against bf16 vs fp32: " << bf16_vs_fp32;
  EXPECT_LT(max_param_diff(ddp, single), 1e-3) << "against bf16 vs fp32: " << bf16_vs_fp32;
  EXPECT_LT(max_param_diff(dp, single), bf16_vs_fp32 / 10);
  EXPECT_LT(max_param_diff(ddp, single), bf16_vs_fp32 / 10);
  for (size_t s = 0; s < single.losses.size(); ++s) {
    EXPECT_NEAR(dp.losses[s], single.losses[s], 1e-4 * std::abs(single.losses[s])) << "step " << s;
    EXPECT_NEAR(ddp.losses[s], single.losses[s], 1e-4 * std::abs(single.losses[s])) << "step " << s;
  }
}

TEST(MixedPrecisionTest, Bf16DdpReplicasStayIdentical) {
  SKIP_WITHOUT_BF16();
  manual_seed(4);
  auto model = mlp();
  DataParallel ddp(model, {.device_ids = cpu_devices(3), .mode = ParallelMode::DDP});
  ddp.set_optimizer(sgd());
  for (int step = 0; step < 3; ++step) {
    amp::AutocastGuard autocast(DeviceKind::CPU);
    ddp.train_step(randn({12, 20}), randn({12, 5}), mse);
  }
  for (size_t r = 1; r < 3; ++r) {
    auto p0 = ddp.replica(0).parameters(), pr = ddp.replica(r).parameters();
    for (size_t k = 0; k < p0.size(); ++k) EXPECT_TRUE(equal(p0[k], pr[k])) << "replica " << r << " param " << k;
  }
}

// reduce_dtype bfloat16: the reduced gradients are bfloat16 values (the sum was rounded to bfloat16), equal on
// every replica, within two bfloat16 roundings (2^-7 of the largest) of the float32 all-reduce's, and half
// the bytes.
TEST(MixedPrecisionTest, Bf16BucketsHalveTheBytesAndRoundTheGradientsOnce) {
  manual_seed(5);
  auto model = mlp();
  Tensor x = randn({16, 20}), y = randn({16, 5});
  DataParallel f32(nn::clone_module(*model, Device::cpu(0)), {.device_ids = cpu_devices(2), .mode = ParallelMode::DDP});
  DataParallel b16(nn::clone_module(*model, Device::cpu(0)),
                   {.device_ids = cpu_devices(2), .mode = ParallelMode::DDP, .reduce_dtype = DType::BFloat16});
  f32.forward_backward(x, y, mse);
  b16.forward_backward(x, y, mse);
  EXPECT_EQ(b16.last_step().reduce.bytes * 2, f32.last_step().reduce.bytes);
  auto want = f32.replica(0).parameters();
  for (size_t r = 0; r < 2; ++r) {
    auto got = b16.replica(r).parameters();
    for (size_t k = 0; k < got.size(); ++k) {
      const Tensor g = got[k].grad();
      EXPECT_TRUE(equal(g, g.to(DType::BFloat16).to(DType::Float32))) << "not bfloat16 values: param " << k;
      EXPECT_TRUE(equal(g, b16.replica(0).parameters()[k].grad())) << "replica " << r << " param " << k;
      const double largest = max_abs_diff(want[k].grad(), zeros(want[k].grad().shape()));
      EXPECT_LE(max_abs_diff(g, want[k].grad()), largest / 128) << "param " << k;
      EXPECT_GT(max_abs_diff(g, want[k].grad()), 0.0) << "param " << k << ": nothing was rounded";
    }
  }
}

TEST(MixedPrecisionTest, ReduceDtypeErrorsNameTheValue) {
  auto model = mlp();
  EXPECT_NE(testing::error_of([&] {
              DataParallel dp(model, {.device_ids = cpu_devices(2), .mode = ParallelMode::DDP,
                                      .reduce_dtype = DType::Float64});
            }).find("reduce_dtype float64 is not float32, bfloat16 or float16"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] {
              DataParallel dp(model, {.device_ids = cpu_devices(2), .mode = ParallelMode::DDP,
                                      .reduce_dtype = DType::BFloat16, .deterministic = true});
            }).find("the deterministic mode does not use"),
            std::string::npos);
}

}  // namespace
}  // namespace dpe
