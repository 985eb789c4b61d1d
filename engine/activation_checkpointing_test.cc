// Activation checkpointing (layers/checkpoint.h) inside the engine: in DP, DDP (with and without
// find_unused_parameters: the checkpoint's parameters are reached and their hooks fire once, so PyTorch's
// reentrant-checkpoint crash with DDP cannot happen here) and ZeRO stage 2, a Llama checkpointed per block and a
// Sequential with dropout checkpointed in segments train to the same bits as without it.
#include <gtest/gtest.h>

#include "core/allocator.h"
#include "core/ops.h"
#include "engine/data_parallel.h"
#include "layers/activation.h"
#include "layers/containers.h"
#include "layers/dropout.h"
#include "layers/linear.h"
#include "layers/llama.h"
#include "layers/loss.h"
#include "optim/adam.h"
#include "tests/testing/devices.h"

namespace dpe {
namespace {

using testing::cpu_devices;

struct Engine {
  const char* name;
  DataParallelOptions options;
};

std::vector<Engine> engines() {
  return {{"dp", {.device_ids = cpu_devices(3)}},
          {"ddp", {.device_ids = cpu_devices(3), .mode = ParallelMode::DDP}},
          {"ddp find_unused", {.device_ids = cpu_devices(3), .mode = ParallelMode::DDP, .find_unused_parameters = true}},
          {"ddp zero2", {.device_ids = cpu_devices(3), .mode = ParallelMode::DDP, .zero_stage = 2}}};
}

OptimizerFactory adamw() {
  return [](const std::vector<Tensor>& p) { return std::make_unique<optim::AdamW>(p, optim::AdamWOptions{.lr = 1e-2}); };
}

// Three train steps of `model` (the same batches for any engine); replica 0's parameters after them.
std::vector<Tensor> train(std::shared_ptr<nn::Module> model, const DataParallelOptions& options,
                          const std::function<std::pair<Tensor, Tensor>(int)>& batch, const LossFn& loss) {
  DataParallel dp(std::move(model), options);
  dp.set_optimizer(adamw());
  manual_seed(42);  // dropout's draws start at the same place in both runs
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = batch(step);
    dp.train_step(x, y, loss);
  }
  return dp.parameters();
}

void expect_bitwise(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) EXPECT_TRUE(equal(got[k], want[k])) << what << ": parameter " << k;
}

TEST(ActivationCheckpointing, LlamaPerBlockTrainsToTheSameBitsInEveryMode) {
  const nn::LlamaConfig config{.vocab_size = 37, .dim = 32, .num_layers = 3, .num_heads = 4, .hidden_dim = 48,
                               .max_seq_len = 16, .num_kv_heads = 2};
  manual_seed(1);
  auto model = std::make_shared<nn::Llama>(config);
  auto batch = [](int step) {
    manual_seed(100 + static_cast<uint64_t>(step));
    return std::pair{(rand({6, 16}) * 37.0).to(DType::Int64), (rand({6, 16}) * 37.0).to(DType::Int64)};
  };
  LossFn loss = [](const Tensor& logits, const Tensor& target) {
    return nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}));
  };
  for (const Engine& engine : engines()) {
    auto plain = std::static_pointer_cast<nn::Llama>(model->clone(Device::cpu(0)));
    auto checkpointed = std::static_pointer_cast<nn::Llama>(model->clone(Device::cpu(0)));
    checkpointed->set_activation_checkpointing(true);
    expect_bitwise(train(checkpointed, engine.options, batch, loss), train(plain, engine.options, batch, loss),
                   engine.name);
  }
}

TEST(ActivationCheckpointing, SequentialWithDropoutTrainsToTheSameBitsInEveryMode) {
  manual_seed(2);
  auto model = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(6, 24), std::make_shared<nn::ReLU>(), std::make_shared<nn::Dropout>(0.25),
      std::make_shared<nn::Linear>(24, 24), std::make_shared<nn::Tanh>(), std::make_shared<nn::Dropout>(0.25),
      std::make_shared<nn::Linear>(24, 3)});
  auto batch = [](int step) {
    manual_seed(200 + static_cast<uint64_t>(step));
    return std::pair{randn({9, 6}), randn({9, 3})};
  };
  LossFn loss = [](const Tensor& out, const Tensor& target) { return nn::functional::mse_loss(out, target); };
  for (const Engine& engine : engines()) {
    auto plain = std::static_pointer_cast<nn::Sequential>(model->clone(Device::cpu(0)));
    auto checkpointed = std::static_pointer_cast<nn::Sequential>(model->clone(Device::cpu(0)));
    checkpointed->set_checkpoint_segments(3);
    expect_bitwise(train(checkpointed, engine.options, batch, loss), train(plain, engine.options, batch, loss),
                   engine.name);
  }
}

// The peak of every device during a step is lower with checkpointing, in every mode: 8 pairs of Linear and Tanh
// on 3 devices, their activations (1024 rows of 256 per device, 1 MB a tensor) larger than the parameters (256 KB
// a matrix), as in the models checkpointing is for.
TEST(ActivationCheckpointing, EveryDevicePeaksLowerInEveryMode) {
  manual_seed(3);
  auto model = std::make_shared<nn::Sequential>();
  for (int i = 0; i < 8; ++i) {
    model->push_back(std::make_shared<nn::Linear>(256, 256));
    model->push_back(std::make_shared<nn::Tanh>());
  }
  LossFn loss = [](const Tensor& out, const Tensor& target) { return nn::functional::mse_loss(out, target); };
  const Tensor x = randn({3072, 256}), y = randn({3072, 256});
  auto peaks = [&](const Engine& engine, int64_t segments) {
    auto copy = std::static_pointer_cast<nn::Sequential>(model->clone(Device::cpu(0)));
    copy->set_checkpoint_segments(segments);
    DataParallel dp(copy, engine.options);
    dp.set_optimizer(adamw());
    dp.train_step(x, y, loss);  // the optimizer's state exists from here on
    for (const Device& d : dp.device_ids()) reset_peak_memory_stats(d);
    dp.train_step(x, y, loss);
    std::vector<int64_t> out;
    for (const Device& d : dp.device_ids()) out.push_back(memory_stats(d).peak_allocated_bytes);
    return out;
  };
  for (const Engine& engine : engines()) {
    const std::vector<int64_t> plain = peaks(engine, 0), checkpointed = peaks(engine, 4);
    for (size_t d = 0; d < plain.size(); ++d) {
      EXPECT_LT(checkpointed[d], plain[d]) << engine.name << " device " << d << ": " << checkpointed[d] << " vs " << plain[d];
    }
  }
}

}  // namespace
}  // namespace dpe
