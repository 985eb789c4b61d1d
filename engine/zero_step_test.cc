// ZeRO stages 1 and 2 (engine/zero_step.h): the layout's balance; training equal to plain DDP's (1e-6; bitwise in
// the deterministic mode) with SGD-momentum, Adam and AdamW, frozen and unused parameters, gradient
// accumulation, clipping, loss scaling and bfloat16 autocast, on 2, 3 and 5 devices; optimizer state per device
// the owned share; checkpoints that do not depend on the stage or the device count; a dropped device; errors.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>

#include "core/allocator.h"
#include "core/amp/autocast.h"
#include "core/ops.h"
#include "engine/data_parallel.h"
#include "engine/ddp_reducer.h"
#include "engine/zero_layout.h"
#include "layers/activation.h"
#include "layers/containers.h"
#include "layers/embedding.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "optim/adam.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "tests/testing/compare.h"
#include "tests/testing/devices.h"
#include "tests/testing/errors.h"

namespace dpe {
namespace {

using nn::Cloneable;
using nn::Linear;
using testing::cpu_devices;
using testing::error_of;

// Odd sizes, so that shards cut parameters in the middle; `skip` is never used by forward().
class Net : public Cloneable<Net> {
 public:
  explicit Net(bool with_unused = false) : Cloneable("Net"), with_unused_(with_unused) { reset(); }
  void reset() override {
    fc1 = register_module("fc1", std::make_shared<Linear>(7, 13));
    fc2 = register_module("fc2", std::make_shared<Linear>(13, 11));
    if (with_unused_) skip = register_module("skip", std::make_shared<Linear>(11, 5));
    fc3 = register_module("fc3", std::make_shared<Linear>(11, 3));
  }
  Tensor forward(const Tensor& x) override { return fc3->forward(tanh(fc2->forward(relu(fc1->forward(x))))); }
  std::shared_ptr<Linear> fc1, fc2, fc3, skip;

 private:
  bool with_unused_;
};

Tensor mse(const Tensor& out, const Tensor& target) { return nn::functional::mse_loss(out, target); }

OptimizerFactory sgd() {
  return [](const std::vector<Tensor>& p) {
    return std::make_unique<optim::SGD>(p, optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3});
  };
}
OptimizerFactory adam() {
  return [](const std::vector<Tensor>& p) {
    return std::make_unique<optim::Adam>(p, optim::AdamOptions{.lr = 1e-2, .weight_decay = 1e-3});
  };
}
// Decay on matrices only: two param groups, so that pieces keep their group's hyper-parameters.
OptimizerFactory adamw() {
  return [](const std::vector<Tensor>& params) {
    std::vector<Tensor> matrices, vectors;
    for (const Tensor& p : params) (p.dim() >= 2 ? matrices : vectors).push_back(p);
    auto optimizer = std::make_unique<optim::AdamW>(matrices, optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.1});
    optimizer->add_param_group({.params = vectors, .options = {{"weight_decay", 0.0}}});
    return optimizer;
  };
}

struct Recipe {
  int devices = 2;
  int stage = 0;
  OptimizerFactory optimizer = adamw();
  bool with_unused = false;
  bool freeze_fc1 = false;
  int accumulate = 1;  // micro-batches per step, all but the last inside no_sync
  double clip = 0;     // clip_grad_norm's max norm (0: none)
  bool deterministic = false;
  bool autocast = false;  // bfloat16 autocast on the CPU (float32 where the CPU lacks bfloat16 instructions)
  int steps = 4;
};

struct Trained {
  std::vector<Tensor> params;
  optim::OptimizerStateDict state;
  std::vector<double> losses, norms;
};

DataParallelOptions options_of(const Recipe& recipe) {
  return {.device_ids = cpu_devices(recipe.devices), .mode = ParallelMode::DDP,
          .find_unused_parameters = recipe.with_unused, .bucket_cap_mb = 0.0002,  // 210 B: several buckets
          .deterministic = recipe.deterministic, .zero_stage = recipe.stage};
}

Trained train(const Recipe& recipe) {
  manual_seed(7);
  auto net = std::make_shared<Net>(recipe.with_unused);
  if (recipe.freeze_fc1) net->fc1->weight.set_requires_grad(false);
  DataParallel dp(net, options_of(recipe));
  dp.set_optimizer(recipe.optimizer);
  Trained out;
  std::optional<amp::AutocastGuard> autocast;
  if (recipe.autocast) autocast.emplace(DeviceKind::CPU);
  for (int step = 0; step < recipe.steps; ++step) {
    dp.zero_grad();
    double loss = 0;
    for (int micro = 0; micro < recipe.accumulate; ++micro) {
      Tensor x = randn({10, 7}), y = randn({10, 3});
      if (micro + 1 < recipe.accumulate) {
        auto guard = dp.no_sync();
        loss += dp.forward_backward(x, y, mse);
      } else {
        loss += dp.forward_backward(x, y, mse);
      }
    }
    if (recipe.clip > 0) out.norms.push_back(dp.clip_grad_norm(recipe.clip));
    dp.optimizer_step();
    out.losses.push_back(loss);
  }
  for (size_t r = 1; r < dp.device_ids().size(); ++r) {  // every replica holds the whole model after the gather
    auto p0 = dp.replica(0).parameters(), pr = dp.replica(r).parameters();
    for (size_t k = 0; k < p0.size(); ++k) EXPECT_TRUE(equal(p0[k], pr[k])) << "replica " << r << " parameter " << k;
  }
  out.params = dp.replica(0).parameters();
  out.state = dp.optimizer(0).state_dict();
  return out;
}

// Bitwise when `bitwise`, else to 1e-6 relative.
void expect_same(const Trained& got, const Trained& want, bool bitwise, const std::string& what) {
  ASSERT_EQ(got.params.size(), want.params.size());
  for (size_t k = 0; k < got.params.size(); ++k) {
    if (bitwise) {
      EXPECT_TRUE(equal(got.params[k], want.params[k])) << what << ": parameter " << k << " differs by "
                                                        << testing::max_relative_diff(got.params[k], want.params[k]);
    } else {
      EXPECT_LT(testing::max_relative_diff(got.params[k], want.params[k]), 1e-6) << what << ": parameter " << k;
    }
  }
  ASSERT_EQ(got.state.tensors.size(), want.state.tensors.size()) << what;
  for (const auto& [i, named] : want.state.tensors) {
    for (const auto& [name, t] : named) {
      const Tensor& mine = got.state.tensors.at(i).at(name);
      if (bitwise) {
        EXPECT_TRUE(equal(mine, t)) << what << ": " << name << " of " << i;
      } else {
        EXPECT_LT(testing::max_relative_diff(mine, t), 1e-6) << what << ": " << name << " of " << i;
      }
    }
  }
  EXPECT_EQ(got.state.scalars, want.state.scalars) << what;
  for (size_t s = 0; s < want.norms.size(); ++s) EXPECT_NEAR(got.norms[s], want.norms[s], 1e-6 * want.norms[s]) << what;
}

TEST(ZeroLayout, EveryElementHasOneOwnerAndSharesDifferByAtMostOnePerBucket) {
  const std::vector<int64_t> numels = {91, 13, 143, 11, 33, 3, 1};
  const std::vector<std::vector<size_t>> buckets = {{6, 5, 4}, {3, 2}, {1, 0}};
  for (size_t ranks : {1u, 2u, 3u, 5u, 8u}) {
    ZeroLayout layout(buckets, numels, ranks);
    std::vector<std::vector<int>> owners(numels.size());
    for (size_t p = 0; p < numels.size(); ++p) owners[p].assign(static_cast<size_t>(numels[p]), 0);
    int64_t most = 0, least = INT64_MAX;
    for (size_t k = 0; k < ranks; ++k) {
      for (const ZeroPiece& piece : layout.pieces(k)) {
        EXPECT_EQ(layout.bucket_offset(piece.param) + piece.start,
                  static_cast<int64_t>(k) * layout.shard_numel(piece.bucket) + piece.shard_offset);
        for (int64_t e = piece.start; e < piece.start + piece.length; ++e) ++owners[piece.param][static_cast<size_t>(e)];
      }
      most = std::max(most, layout.owned_numel(k));
      least = std::min(least, layout.owned_numel(k));
    }
    for (size_t p = 0; p < numels.size(); ++p) {
      for (int count : owners[p]) EXPECT_EQ(count, 1) << ranks << " ranks, parameter " << p;
    }
    EXPECT_LE(most - least, static_cast<int64_t>(buckets.size()) * (ranks == 8 ? 3 : 1) + 3) << ranks;
  }
}

TEST(ZeroStep, StagesOneAndTwoTrainLikeDdpWithEveryOptimizer) {
  for (int devices : {2, 3, 5}) {
    for (const auto& [name, optimizer] : std::vector<std::pair<std::string, OptimizerFactory>>{
             {"sgd", sgd()}, {"adam", adam()}, {"adamw", adamw()}}) {
      const Trained ddp = train({.devices = devices, .stage = 0, .optimizer = optimizer});
      for (int stage : {1, 2}) {
        const Trained zero = train({.devices = devices, .stage = stage, .optimizer = optimizer});
        expect_same(zero, ddp, false, name + " stage " + std::to_string(stage) + " on " + std::to_string(devices));
      }
    }
  }
}

TEST(ZeroStep, FrozenUnusedAccumulatedAndClippedTrainLikeDdp) {
  for (int stage : {1, 2}) {
    const std::string what = "stage " + std::to_string(stage);
    expect_same(train({.devices = 3, .stage = stage, .freeze_fc1 = true}), train({.devices = 3, .freeze_fc1 = true}),
                false, what + " frozen");
    expect_same(train({.devices = 3, .stage = stage, .with_unused = true}), train({.devices = 3, .with_unused = true}),
                false, what + " unused");
    expect_same(train({.devices = 2, .stage = stage, .accumulate = 3}), train({.devices = 2, .accumulate = 3}), false,
                what + " accumulated");
    expect_same(train({.devices = 3, .stage = stage, .clip = 0.05}), train({.devices = 3, .clip = 0.05}), false,
                what + " clipped");
    expect_same(train({.devices = 2, .stage = stage, .autocast = true}), train({.devices = 2, .autocast = true}), false,
                what + " autocast");
  }
}

TEST(ZeroStep, DeterministicModeIsBitwiseDdpForAnyDeviceCount) {
  const Trained ddp = train({.devices = 2, .deterministic = true});
  for (int devices : {2, 3}) {
    for (int stage : {1, 2}) {
      expect_same(train({.devices = devices, .stage = stage, .deterministic = true}), ddp, true,
                  "deterministic stage " + std::to_string(stage) + " on " + std::to_string(devices));
    }
  }
}

TEST(ZeroStep, OptimizerStateAndGradientsPerDeviceAreTheOwnedShare) {
  manual_seed(3);
  auto net = std::make_shared<Net>();
  int64_t numel = 0;
  for (const Tensor& p : net->parameters()) numel += p.numel();
  auto rounded = [](int64_t bytes) { return static_cast<int64_t>(CachingAllocator::round_size(static_cast<size_t>(bytes))); };
  for (int stage : {1, 2}) {
    const int devices = 3;
    std::vector<MemoryStats> before;
    for (int r = 0; r < devices; ++r) before.push_back(memory_stats(Device::cpu(r)));
    DataParallel dp(nn::clone_module(*net, Device::cpu(0)), options_of({.devices = devices, .stage = stage}));
    dp.set_optimizer(adam());
    dp.train_step(randn({9, 7}), randn({9, 3}), mse);
    const ZeroLayout& layout = dp.ddp_reducer()->zero_layout();
    int64_t total = 0;
    for (size_t r = 0; r < static_cast<size_t>(devices); ++r) {
      const int64_t owned = layout.owned_numel(r);
      EXPECT_EQ(dp.optimizer(r).state_bytes(), 2 * owned * 4) << "stage " << stage << " replica " << r;
      // The device's allocator counts the same as optimizer state: exp_avg and exp_avg_sq of each piece this
      // replica owns, each block rounded (core/allocator.h); as gradients, only the shards in stage 2.
      const MemoryStats now = memory_stats(Device::cpu(static_cast<int>(r)));
      auto tagged = [&](MemoryKind k) { return now.by_kind(k) - before[r].by_kind(k); };
      int64_t state_blocks = 0;
      for (const optim::ParamGroup& group : dp.optimizer(r).param_groups()) {
        for (const Tensor& piece : group.params) state_blocks += 2 * rounded(piece.numel() * 4);
      }
      EXPECT_EQ(tagged(MemoryKind::OptimizerState), state_blocks) << "stage " << stage << " replica " << r;
      int64_t shard_blocks = 0;
      for (size_t b = 0; b < layout.num_buckets(); ++b) shard_blocks += rounded(layout.shard_numel(b) * 4);
      if (stage == 2) EXPECT_EQ(tagged(MemoryKind::Gradients), shard_blocks) << "replica " << r;
      if (stage == 1) EXPECT_GE(tagged(MemoryKind::Gradients), numel * 4) << "replica " << r;  // whole buckets
      EXPECT_LE(owned, numel / devices + static_cast<int64_t>(layout.num_buckets())) << r;
      total += owned;
      // Stage 2: no replica keeps a whole gradient, only its shard of each bucket.
      int64_t grads = 0;
      for (const Tensor& p : dp.replica(r).parameters()) grads += p.grad().defined() ? p.grad().numel() : 0;
      EXPECT_EQ(grads, stage == 2 ? 0 : numel) << "stage " << stage << " replica " << r;
      if (stage == 2) {
        for (size_t b = 0; b < layout.num_buckets(); ++b) {
          EXPECT_EQ(dp.ddp_reducer()->shard_gradient(r, b).numel(), layout.shard_numel(b));
        }
      }
    }
    EXPECT_EQ(total, numel);
  }
}

// The whole state on save, cut again on load: ZeRO-2 on 3 devices -> plain DDP on 2 -> ZeRO-1 on 1 device, each
// continuing exactly where the other stopped, as one uninterrupted DDP run does.
TEST(ZeroStep, CheckpointsMoveBetweenStagesAndDeviceCounts) {
  manual_seed(11);
  auto net = std::make_shared<Net>();
  std::vector<std::pair<Tensor, Tensor>> batches;
  for (int s = 0; s < 6; ++s) batches.emplace_back(randn({12, 7}), randn({12, 3}));
  auto run = [&](DataParallel& dp, int from, int to) {
    for (int s = from; s < to; ++s) dp.train_step(batches[s].first, batches[s].second, mse);
  };
  DataParallel whole(nn::clone_module(*net, Device::cpu(0)), options_of({.devices = 2}));
  whole.set_optimizer(adamw());
  run(whole, 0, 6);

  auto legs = std::vector<Recipe>{{.devices = 3, .stage = 2}, {.devices = 2, .stage = 0}, {.devices = 1, .stage = 1}};
  std::shared_ptr<nn::Module> model = nn::clone_module(*net, Device::cpu(0));
  std::optional<optim::OptimizerStateDict> state;
  for (size_t leg = 0; leg < legs.size(); ++leg) {
    DataParallel dp(model, options_of(legs[leg]));
    dp.set_optimizer(adamw());
    if (state) {
      for (size_t r = 0; r < dp.num_optimizers(); ++r) dp.optimizer(r).load_state_dict(*state);
    }
    run(dp, static_cast<int>(2 * leg), static_cast<int>(2 * leg + 2));
    state = dp.optimizer(0).state_dict();
    model = nn::clone_module(dp.module(), Device::cpu(0));
  }
  auto want = whole.parameters(), got = model->parameters();
  for (size_t k = 0; k < want.size(); ++k) EXPECT_LT(testing::max_relative_diff(got[k], want[k]), 1e-6) << k;
  const optim::OptimizerStateDict reference = whole.optimizer(0).state_dict();
  ASSERT_EQ(state->tensors.size(), reference.tensors.size());
  for (const auto& [i, named] : reference.tensors) {
    for (const auto& [name, t] : named) EXPECT_LT(testing::max_relative_diff(state->tensors.at(i).at(name), t), 1e-6);
  }
  EXPECT_EQ(state->scalars, reference.scalars);
}

// DropDevice: the dropped replica's shard is gathered with the rest and the state cut again over the survivors.
TEST(ZeroStep, ADroppedDeviceRepartitionsAndTrainingGoesOn) {
  for (int stage : {1, 2}) {
    manual_seed(5);
    auto net = std::make_shared<Net>();
    DataParallelOptions options = options_of({.devices = 3, .stage = stage});
    options.on_device_failure = DeviceFailurePolicy::DropDevice;
    DataParallel dp(nn::clone_module(*net, Device::cpu(0)), options);
    DataParallel reference(nn::clone_module(*net, Device::cpu(0)), options_of({.devices = 2}));
    dp.set_optimizer(adamw());
    reference.set_optimizer(adamw());
    Tensor x = randn({12, 7}), y = randn({12, 3});
    dp.train_step(x, y, mse);
    reference.train_step(x, y, mse);
    dp.process_group()->inject_failure_for_tests(2, stage == 2 ? Collective::ReduceScatter : Collective::AllReduceInto);
    x = randn({12, 7}), y = randn({12, 3});
    dp.train_step(x, y, mse);
    reference.train_step(x, y, mse);
    ASSERT_EQ(dp.device_ids().size(), 2u) << "stage " << stage;
    EXPECT_FALSE(dp.last_step().recovered_failures.empty());
    auto want = reference.parameters(), got = dp.parameters();
    for (size_t k = 0; k < want.size(); ++k) EXPECT_LT(testing::max_relative_diff(got[k], want[k]), 1e-6) << k;
    EXPECT_EQ(dp.optimizer(0).state_dict().scalars, reference.optimizer(0).state_dict().scalars);
  }
}

TEST(ZeroStep, SwitchingToDpAndBackKeepsTheState) {
  manual_seed(9);
  auto net = std::make_shared<Net>();
  DataParallel zero(nn::clone_module(*net, Device::cpu(0)), options_of({.devices = 3, .stage = 2}));
  DataParallel ddp(nn::clone_module(*net, Device::cpu(0)), options_of({.devices = 3}));
  zero.set_optimizer(adam());
  ddp.set_optimizer(adam());
  for (int s = 0; s < 6; ++s) {
    if (s == 2) zero.set_mode(ParallelMode::DP);
    if (s == 4) zero.set_mode(ParallelMode::DDP);
    Tensor x = randn({12, 7}), y = randn({12, 3});
    zero.train_step(x, y, mse);
    ddp.train_step(x, y, mse);
  }
  auto want = ddp.parameters(), got = zero.parameters();
  for (size_t k = 0; k < want.size(); ++k) EXPECT_LT(testing::max_relative_diff(got[k], want[k]), 1e-5) << k;
}

// Loss scaling through the pieces: unscale_ (before clipping) and the step's found-inf check act on what each
// replica steps; an inf in one replica's shard skips the step on every replica.
TEST(ZeroStep, LossScalingUnscalesThePiecesAndAnInfAnywhereSkipsEverywhere) {
  for (int stage : {1, 2}) {
    auto run = [&](int zero_stage, bool plant_inf) {
      manual_seed(17);
      DataParallel dp(std::make_shared<Net>(), options_of({.devices = 3, .stage = zero_stage}));
      dp.set_optimizer(adamw());
      auto scaler = std::make_shared<optim::GradScaler>(optim::GradScalerOptions{.growth_interval = 2});
      dp.set_grad_scaler(scaler);
      std::vector<double> norms;
      for (int step = 0; step < 4; ++step) {
        dp.zero_grad();
        dp.forward_backward(randn({12, 7}), randn({12, 3}), mse);
        if (plant_inf && step == 2) {
          // The last replica's first piece: a gradient only that replica steps.
          Tensor grad = dp.optimizer(2).param_groups()[0].params[0].grad();
          grad.fill_(std::numeric_limits<double>::infinity());
        }
        for (size_t r = 0; r < dp.num_optimizers(); ++r) scaler->unscale_(dp.optimizer(r));
        norms.push_back(dp.clip_grad_norm(0.5));
        dp.optimizer_step();
        EXPECT_EQ(dp.last_step().skipped_step, plant_inf && step == 2) << "stage " << zero_stage << " step " << step;
      }
      return std::pair{dp.parameters(), norms};
    };
    const auto [want, want_norms] = run(0, false);
    const auto [got, got_norms] = run(stage, false);
    for (size_t k = 0; k < want.size(); ++k) {
      EXPECT_LT(testing::max_relative_diff(got[k], want[k]), 1e-6) << "stage " << stage << " parameter " << k;
    }
    for (size_t s = 0; s < want_norms.size(); ++s) EXPECT_NEAR(got_norms[s], want_norms[s], 1e-6 * want_norms[s]);
    run(stage, true);
  }
}

TEST(ZeroStep, BadStagesAndModesAreRefusedNamingTheValue) {
  auto net = std::make_shared<Net>();
  EXPECT_NE(error_of([&] { DataParallel(net, {.device_ids = cpu_devices(2), .mode = ParallelMode::DDP, .zero_stage = 3}); })
                .find("zero_stage 3 is not a ZeRO stage; expected 0 (none), 1 (optimizer state) or 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] { DataParallel(net, {.device_ids = cpu_devices(2), .zero_stage = 1}); })
                .find("zero_stage 1 shards DDP mode's optimizers; mode dp has one; use mode ddp"),
            std::string::npos);
}

}  // namespace
}  // namespace dpe
