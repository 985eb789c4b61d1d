// The Llama (grouped-query attention, right-padded rows whose padded targets are ignored) trains the same in
// every mode: DP and DDP on 2 and 3 devices equal one device on the full batch (1e-5), and the deterministic
// mode gives the same bits for 1, 2 and 3 devices, DP and DDP. The loss is the mean over the batch's real
// targets in every mode (the token count of the whole batch, each shard's sum scaled by its share of the rows:
// dpe train's Note [The loss of a batch with padding]).
#include <gtest/gtest.h>

#include "core/ops.h"
#include "engine/data_parallel.h"
#include "layers/llama.h"
#include "layers/loss.h"
#include "optim/adam.h"
#include "tests/testing/compare.h"
#include "tests/testing/devices.h"

namespace dpe {
namespace {

using testing::cpu_devices;

constexpr int64_t kIgnore = -100;

nn::LlamaConfig config() {
  return {.vocab_size = 37, .dim = 32, .num_layers = 2, .num_heads = 4, .hidden_dim = 48, .max_seq_len = 16,
          .num_kv_heads = 2};
}

// Rows of tokens, right-padded: row r holds 16 - (r % 4) * 3 real targets, the rest kIgnore.
struct Batch {
  Tensor inputs, targets;
  int64_t real_targets = 0;
};

Batch batch(int64_t rows, uint64_t seed) {
  manual_seed(seed);
  Tensor inputs = (rand({rows, 16}) * 37.0).to(DType::Int64);
  std::vector<int64_t> targets = (rand({rows, 16}) * 37.0).to(DType::Int64).to_vector<int64_t>();
  int64_t real = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t length = 16 - (r % 4) * 3;
    for (int64_t t = length; t < 16; ++t) targets[r * 16 + t] = kIgnore;
    real += length;
  }
  return {inputs, Tensor::from_vector(targets, {rows, 16}, TensorOptions(DType::Int64)), real};
}

// The token mean of the whole batch, whichever rows a replica (or a virtual shard) holds.
LossFn token_mean(int64_t rows, int64_t real_targets) {
  return [=](const Tensor& logits, const Tensor& target) {
    Tensor sum = nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}),
                                               {.reduction = nn::Reduction::Sum});
    return sum * (static_cast<double>(rows) / (static_cast<double>(target.size(0)) * static_cast<double>(real_targets)));
  };
}

struct Trained {
  std::vector<Tensor> params;
  std::vector<double> losses;
};

Trained train(const std::vector<Device>& devices, ParallelMode mode, bool deterministic) {
  manual_seed(5);
  auto model = std::make_shared<nn::Llama>(config());
  DataParallel dp(model, {.device_ids = devices, .mode = mode, .deterministic = deterministic});
  dp.set_optimizer([](const std::vector<Tensor>& p) {
    return std::make_unique<optim::AdamW>(p, optim::AdamWOptions{.lr = 3e-3});
  });
  Trained out;
  for (uint64_t step = 0; step < 4; ++step) {
    const Batch b = batch(6, 100 + step);
    out.losses.push_back(dp.train_step(b.inputs, b.targets, token_mean(6, b.real_targets)));
  }
  for (const Tensor& p : dp.module().parameters()) out.params.push_back(p.detach().clone());
  return out;
}

TEST(LlamaEquivalence, DpAndDdpEqualOneDeviceWithPaddingAndGqa) {
  const Trained one = train(cpu_devices(1), ParallelMode::DP, false);
  for (int64_t n : {2, 3}) {
    for (ParallelMode mode : {ParallelMode::DP, ParallelMode::DDP}) {
      SCOPED_TRACE(::testing::Message() << mode_name(mode) << " on " << n << " devices");
      const Trained many = train(cpu_devices(n), mode, false);
      for (size_t s = 0; s < one.losses.size(); ++s) EXPECT_NEAR(many.losses[s], one.losses[s], 1e-5 * one.losses[s]);
      for (size_t k = 0; k < one.params.size(); ++k) {
        EXPECT_LT(testing::max_relative_diff(many.params[k], one.params[k]), 1e-5) << "parameter " << k;
      }
    }
  }
}

TEST(LlamaEquivalence, DeterministicIsBitwiseTheSameForAnyDeviceCountAndMode) {
  const Trained reference = train(cpu_devices(1), ParallelMode::DP, true);
  for (int64_t n : {1, 2, 3}) {
    for (ParallelMode mode : {ParallelMode::DP, ParallelMode::DDP}) {
      SCOPED_TRACE(::testing::Message() << mode_name(mode) << " on " << n << " devices");
      const Trained run = train(cpu_devices(n), mode, true);
      EXPECT_EQ(run.losses, reference.losses);
      for (size_t k = 0; k < reference.params.size(); ++k) {
        EXPECT_EQ(run.params[k].to_vector<float>(), reference.params[k].to_vector<float>()) << "parameter " << k;
      }
    }
  }
}

}  // namespace
}  // namespace dpe
