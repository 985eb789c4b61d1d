// The deterministic mode: the same bits after many steps for 1, 2, 3 and 4 devices, DP and DDP, the MLP and
// the CNN (BatchNorm: statistics per virtual shard), SGD with momentum and AdamW, even and uneven batches.
#include <gtest/gtest.h>

#include <optional>

#include "core/backends.h"
#include "core/ops.h"
#include "engine/data_parallel.h"
#include "models/models.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "tests/testing/devices.h"
#include "tests/testing/errors.h"

namespace dpe {
namespace {

using testing::cpu_devices;
using testing::error_of;

struct Run {
  std::string model;
  bool adamw;
  int64_t batch;
  int steps;
  int64_t virtual_shards = 0;  // the default
};

// Random Fashion-MNIST-shaped batches (images in [0, 1), labels 0..9), the same for every configuration.
std::vector<std::pair<Tensor, Tensor>> batches(const Run& run) {
  manual_seed(81);
  std::vector<std::pair<Tensor, Tensor>> out;
  for (int s = 0; s < run.steps; ++s) {
    Tensor x = run.model == "cnn" ? rand({run.batch, 1, 28, 28}) : rand({run.batch, 784});
    Tensor y = (rand({run.batch}) * 10.0).to(DType::Int64);  // truncated: 0..9
    out.emplace_back(x, y);
  }
  return out;
}

nn::StateDict train(const Run& run, const std::vector<Device>& devices, ParallelMode mode) {
  manual_seed(80);
  auto model = models::make_model(run.model);
  model->to(devices[0]);
  DataParallel dp(model, {.device_ids = devices, .mode = mode, .deterministic = true,
                          .virtual_shards = run.virtual_shards});
  dp.set_optimizer([&](const std::vector<Tensor>& p) -> std::unique_ptr<optim::Optimizer> {
    if (run.adamw) return std::make_unique<optim::AdamW>(p, optim::AdamWOptions{.lr = 1e-3});
    return std::make_unique<optim::SGD>(p, optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  });
  const LossFn loss = models::model_loss(run.model);
  for (const auto& [x, y] : batches(run)) dp.train_step(x, y, loss);
  nn::StateDict state = dp.module().state_dict();
  for (auto& [name, t] : state) t = t.to(Device::cpu(0));
  return state;
}

// devices[0..n) for each n of `counts`, DP and DDP, against one device in DP mode.
void expect_bitwise_the_same_everywhere(const Run& run, const std::vector<Device>& devices,
                                        const std::vector<int>& counts) {
  const nn::StateDict want = train(run, {devices[0]}, ParallelMode::DP);
  for (int count : counts) {
    const std::vector<Device> used(devices.begin(), devices.begin() + count);
    for (ParallelMode mode : {ParallelMode::DP, ParallelMode::DDP}) {
      if (count == 1 && mode == ParallelMode::DP) continue;
      const nn::StateDict got = train(run, used, mode);
      ASSERT_EQ(got.size(), want.size());
      for (size_t k = 0; k < got.size(); ++k) {
        EXPECT_TRUE(equal(got[k].second, want[k].second))
            << run.model << (run.adamw ? " adamw" : " sgd") << " batch " << run.batch << ", " << count << " devices "
            << mode_name(mode) << ": " << got[k].first << " differs by " << max_abs_diff(got[k].second, want[k].second);
      }
    }
  }
}

void expect_bitwise_the_same_everywhere(const Run& run) {
  expect_bitwise_the_same_everywhere(run, cpu_devices(4), {1, 2, 3, 4});
}

TEST(Deterministic, MlpIsBitwiseTheSameForAnyDeviceCountAndModeWithSgd) { expect_bitwise_the_same_everywhere({"mlp", false, 32, 20}); }
TEST(Deterministic, MlpIsBitwiseTheSameForAnyDeviceCountAndModeWithAdamW) { expect_bitwise_the_same_everywhere({"mlp", true, 32, 20}); }
TEST(Deterministic, CnnIsBitwiseTheSameForAnyDeviceCountAndModeWithSgd) { expect_bitwise_the_same_everywhere({"cnn", false, 16, 20}); }
TEST(Deterministic, CnnIsBitwiseTheSameForAnyDeviceCountAndModeWithAdamW) { expect_bitwise_the_same_everywhere({"cnn", true, 16, 20}); }
// 30 rows: shards of 8, 8, 7, 7 (K = 4); 3 devices take 2, 1 and 1 shards.
TEST(Deterministic, AnUnevenBatchIsBitwiseTheSameToo) { expect_bitwise_the_same_everywhere({"mlp", true, 30, 20}); }
// K = 8: 3 devices take 3, 3 and 2 shards, which no subtree of the fixed tree matches.
TEST(Deterministic, EightVirtualShardsAreBitwiseTheSameToo) { expect_bitwise_the_same_everywhere({"mlp", true, 40, 10, 8}); }
TEST(Deterministic, AnUnevenCnnBatchIsBitwiseTheSameToo) { expect_bitwise_the_same_everywhere({"cnn", false, 13, 20}); }

// CUDA devices: every logical device this process sees (`DPE_CUDA_LOGICAL_DEVICES=0,0` makes two of one GPU;
// the GPU suite runs the CUDA tests that way too), 1 and all of them, DP and DDP: the same bits. The models
// have no Embedding, whose CUDA backward (index_add's atomics) is not deterministic.
TEST(DeterministicCuda, MlpAndCnnAreBitwiseTheSameOnOneAndEveryCudaDevice) {
  const int n = cuda_device_count();
  if (n < 2) GTEST_SKIP() << "needs two CUDA devices (DPE_CUDA_LOGICAL_DEVICES=0,0 on one GPU); this process sees " << n;
  std::vector<Device> devices;
  for (int i = 0; i < n; ++i) devices.push_back(Device::cuda(i));
  expect_bitwise_the_same_everywhere({"mlp", true, 30, 10}, devices, {1, n});
  expect_bitwise_the_same_everywhere({"cnn", false, 13, 10}, devices, {1, n});
}

// cuDNN's measured algorithm choice (backends::cudnn::benchmark) may pick nondeterministic algorithms, and
// different ones per device: a deterministic step on a CUDA device refuses it, before any work, saying so.
TEST(DeterministicCuda, RefusesCudnnBenchmark) {
  if (cuda_device_count() < 1) GTEST_SKIP() << "no CUDA device";
  backends::cudnn::set_benchmark(true);
  const std::string error = error_of([&] { train({"cnn", false, 8, 1}, {Device::cuda(0)}, ParallelMode::DDP); });
  backends::cudnn::set_benchmark(false);
  EXPECT_NE(error.find("the deterministic mode on cuda:0 needs cuDNN's deterministic algorithms"), std::string::npos)
      << error;
  EXPECT_NO_THROW(train({"cnn", false, 8, 1}, {Device::cuda(0)}, ParallelMode::DDP));  // and runs once it is off
}

// Without the mode, device counts give different bits (the sums run in another order): the test above is not
// vacuous.
TEST(Deterministic, TheDefaultModeDiffersAcrossDeviceCounts) {
  auto run = [](int devices) {
    manual_seed(80);
    DataParallel dp(models::make_model("mlp"), {.device_ids = cpu_devices(devices), .mode = ParallelMode::DDP});
    dp.set_optimizer([](const std::vector<Tensor>& p) { return std::make_unique<optim::AdamW>(p, optim::AdamWOptions{}); });
    for (const auto& [x, y] : batches({"mlp", true, 32, 5})) dp.train_step(x, y, models::model_loss("mlp"));
    return dp.module().state_dict();
  };
  const nn::StateDict one = run(1), two = run(2);
  bool any_differs = false;
  for (size_t k = 0; k < one.size(); ++k) any_differs = any_differs || !equal(one[k].second, two[k].second);
  EXPECT_TRUE(any_differs);
}

// Inside no_sync every backward still sums its shards into every replica (deterministic_step.cc, step 4):
// micro-batches accumulated under the guard give each replica the bits of the same backwards without it.
TEST(Deterministic, NoSyncStillSumsEveryBackwardIntoEveryReplica) {
  auto gradients = [](bool guarded) {
    manual_seed(80);
    DataParallel dp(models::make_model("mlp"),
                    {.device_ids = cpu_devices(2), .mode = ParallelMode::DDP, .deterministic = true});
    const auto micro = batches({"mlp", false, 8, 3});
    {
      std::optional<NoSyncGuard> guard;
      if (guarded) guard.emplace(dp);
      for (int m = 0; m < 2; ++m) dp.forward_backward(micro[m].first, micro[m].second, models::model_loss("mlp"));
    }
    dp.forward_backward(micro[2].first, micro[2].second, models::model_loss("mlp"));
    std::vector<std::vector<Tensor>> grads(2);
    for (size_t r = 0; r < 2; ++r) {
      for (const Tensor& p : dp.replica(r).parameters()) grads[r].push_back(p.grad().clone());
    }
    return grads;
  };
  const auto plain = gradients(false), guarded = gradients(true);
  for (size_t r = 0; r < 2; ++r) {
    for (size_t p = 0; p < plain[0].size(); ++p) {
      EXPECT_TRUE(equal(guarded[r][p], plain[0][p])) << "replica " << r << " parameter " << p;
    }
  }
}

TEST(Deterministic, RefusesWhatItCannotMakeDeterministic) {
  auto make = [](DataParallelOptions options) { DataParallel(models::make_model("mlp"), std::move(options)); };
  EXPECT_NE(error_of([&] { make({.device_ids = cpu_devices(2), .virtual_shards = 4}); })
                .find("virtual_shards = 4 is the deterministic mode's"), std::string::npos);
  EXPECT_NE(error_of([&] { make({.device_ids = cpu_devices(2), .split = SplitRule::Auto, .deterministic = true}); })
                .find("split auto does not apply"), std::string::npos);
  EXPECT_NE(error_of([&] { make({.device_ids = cpu_devices(2), .backend = CollectiveBackend::Mpi, .deterministic = true}); })
                .find("the deterministic mode runs in one process"), std::string::npos);
}

}  // namespace
}  // namespace dpe
