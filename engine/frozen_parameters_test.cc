// Frozen parameters (requires_grad false) in DP and DDP mode: Note [Frozen parameters] in
// engine/data_parallel.h. Every case trains a few steps and compares with one device on the full batch
// (DP on n devices and DDP with even shards both equal it), with the frozen parameters first, in the middle
// and last in registration order, SGD with momentum and AdamW with weight decay (which must not decay a
// frozen parameter), with and without find_unused_parameters, with caller-built replicas, with flags changed
// between steps, and through a checkpoint.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "core/ops.h"
#include "io/checkpoint.h"
#include "engine/data_parallel.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "optim/adam.h"
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
using testing::max_relative_diff;

// Registration order: fc1.weight, fc1.bias, fc2.weight, fc2.bias, fc3.weight, fc3.bias.
class Net : public Cloneable<Net> {
 public:
  Net() : Cloneable("Net") { reset(); }
  void reset() override {
    fc1 = register_module("fc1", std::make_shared<Linear>(6, 8));
    fc2 = register_module("fc2", std::make_shared<Linear>(8, 8));
    fc3 = register_module("fc3", std::make_shared<Linear>(8, 3));
  }
  Tensor forward(const Tensor& x) override { return fc3->forward(relu(fc2->forward(relu(fc1->forward(x))))); }
  std::shared_ptr<Linear> fc1, fc2, fc3;
};

using Names = std::set<std::string>;

Tensor mse(const Tensor& out, const Tensor& target) { return nn::functional::mse_loss(out, target); }

void set_frozen(nn::Module& module, const Names& frozen, bool is_frozen = true) {
  for (auto& [name, p] : module.named_parameters()) {
    if (frozen.contains(name)) p.set_requires_grad(!is_frozen);
  }
}

OptimizerFactory sgd() {
  return [](const std::vector<Tensor>& p) {
    return std::make_unique<optim::SGD>(p, optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  };
}

OptimizerFactory adamw() {
  return [](const std::vector<Tensor>& p) {
    return std::make_unique<optim::AdamW>(p, optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.1});
  };
}

struct Case {
  ParallelMode mode;
  Names frozen;
  bool find_unused = false;
  bool adam = false;
};

std::string describe(const Case& c) {
  std::string s = std::string(mode_name(c.mode)) + (c.adam ? " adamw" : " sgd") + (c.find_unused ? " find_unused" : "") + " frozen:";
  for (const std::string& n : c.frozen) s += " " + n;
  return s;
}

// Trains `steps` steps in the case's mode on 3 devices and on one device (the reference) and checks the
// contract: frozen parameters bit-identical and without gradient on every replica, the others equal to the
// reference, DDP replicas identical.
void check_case(const Case& c, int steps = 4) {
  SCOPED_TRACE(describe(c));
  manual_seed(7);
  auto net = std::make_shared<Net>();
  set_frozen(*net, c.frozen);
  const nn::StateDict initial = nn::clone_module(*net, Device::cpu(0))->state_dict();
  auto reference = nn::clone_module(*net, Device::cpu(0));
  const OptimizerFactory make = c.adam ? adamw() : sgd();
  auto reference_optimizer = make(reference->parameters());
  DataParallel dp(net, {.device_ids = cpu_devices(3), .mode = c.mode, .find_unused_parameters = c.find_unused});
  dp.set_optimizer(make);
  for (int step = 0; step < steps; ++step) {
    Tensor x = randn({12, 6}), y = randn({12, 3});
    reference_optimizer->zero_grad();
    mse(reference->forward(x), y).backward();
    reference_optimizer->step();
    dp.train_step(x, y, mse);
  }
  const size_t replicas = c.mode == ParallelMode::DDP ? 3 : 1;
  const nn::StateDict expected = reference->state_dict();
  for (size_t r = 0; r < replicas; ++r) {
    const nn::StateDict state = dp.replica(r).state_dict();
    for (size_t k = 0; k < state.size(); ++k) {
      const auto& [name, value] = state[k];
      if (c.frozen.contains(name)) {
        EXPECT_TRUE(equal(value, initial[k].second)) << "replica " << r << " changed frozen " << name;
        EXPECT_FALSE(value.requires_grad()) << name;
      } else {
        EXPECT_LT(max_relative_diff(value, expected[k].second), 1e-5) << "replica " << r << " " << name;
      }
    }
  }
  // Gradients, of the last step: none for a frozen parameter on any replica (DP's clones included).
  for (size_t r = 0; r < 3; ++r) {
    for (const auto& [name, p] : dp.replica(r).named_parameters()) {
      if (c.frozen.contains(name)) {
        EXPECT_FALSE(p.grad().defined()) << "replica " << r << " " << name;
      }
      EXPECT_EQ(p.requires_grad(), !c.frozen.contains(name)) << "replica " << r << " " << name;
    }
  }
}

TEST(FrozenParametersTest, FirstMiddleAndLastInBothModesWithSgdAndAdamW) {
  const std::vector<Names> placements = {
      {"fc1.weight", "fc1.bias"},  // first: a frozen backbone
      {"fc2.weight"},              // in the middle
      {"fc3.bias"},                // last
      {"fc1.weight", "fc1.bias", "fc3.weight"},
  };
  for (const Names& frozen : placements) {
    for (bool adam : {false, true}) {
      check_case({.mode = ParallelMode::DP, .frozen = frozen, .adam = adam});
      for (bool find_unused : {false, true}) {
        check_case({.mode = ParallelMode::DDP, .frozen = frozen, .find_unused = find_unused, .adam = adam});
      }
    }
  }
}

TEST(FrozenParametersTest, FrozenParametersAreNotInTheReductionOrTheBuckets) {
  manual_seed(8);
  auto net = std::make_shared<Net>();
  set_frozen(*net, {"fc1.weight", "fc1.bias"});
  int64_t trainable_bytes = 0;
  for (const Tensor& p : net->parameters()) trainable_bytes += p.requires_grad() ? static_cast<int64_t>(p.nbytes()) : 0;
  DataParallel ddp(nn::clone_module(*net, Device::cpu(0)), {.device_ids = cpu_devices(2), .mode = ParallelMode::DDP});
  ddp.forward_backward(randn({4, 6}), randn({4, 3}), mse);
  EXPECT_EQ(ddp.last_step().reduce.bytes, 2 * trainable_bytes);  // all-reduced: trainable parameters only
  DataParallel dp(nn::clone_module(*net, Device::cpu(0)), {.device_ids = cpu_devices(2)});
  dp.forward_backward(randn({4, 6}), randn({4, 3}), mse);
  EXPECT_EQ(dp.last_step().reduce.bytes, trainable_bytes);  // reduced into the master: one replica's
}

TEST(FrozenParametersTest, CallerBuiltDdpReplicasMustFreezeTheSameParameters) {
  auto make_replicas = [](const Names& frozen_on_1) {
    std::vector<std::shared_ptr<nn::Module>> replicas;
    for (int r = 0; r < 2; ++r) {
      manual_seed(100 + r);  // different initial values: replica 0's are broadcast
      auto net = std::make_shared<Net>();
      set_frozen(*net, r == 1 ? frozen_on_1 : Names{"fc2.weight"});
      net->to(Device::cpu(r));
      replicas.push_back(net);
    }
    return replicas;
  };
  {
    DataParallel ddp(make_replicas({"fc2.weight"}), {.device_ids = cpu_devices(2), .mode = ParallelMode::DDP});
    Tensor before = dynamic_cast<Net&>(ddp.replica(0)).fc2->weight.clone();
    ddp.set_optimizer(sgd());
    for (int step = 0; step < 3; ++step) ddp.train_step(randn({4, 6}), randn({4, 3}), mse);
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(equal(dynamic_cast<Net&>(ddp.replica(r)).fc2->weight.to(Device::cpu(0)), before)) << r;
      EXPECT_TRUE(equal(dynamic_cast<Net&>(ddp.replica(r)).fc1->weight.to(Device::cpu(0)),
                        dynamic_cast<Net&>(ddp.replica(0)).fc1->weight)) << r;
    }
  }
  std::string e = error_of([&] {
    DataParallel ddp(make_replicas({"fc3.bias"}), {.device_ids = cpu_devices(2), .mode = ParallelMode::DDP});
  });
  EXPECT_NE(e.find("DDP: replica 1's 'fc2.weight' has requires_grad true, replica 0's has false"), std::string::npos) << e;
}

// Freezing (and unfreezing) on the master between steps is picked up at the next step, in both modes,
// exactly as a single module whose flags change at the same point.
TEST(FrozenParametersTest, ChangesOnTheMasterArePickedUpAtTheNextStep) {
  for (ParallelMode mode : {ParallelMode::DP, ParallelMode::DDP}) {
    SCOPED_TRACE(mode_name(mode));
    manual_seed(9);
    auto net = std::make_shared<Net>();
    auto reference = nn::clone_module(*net, Device::cpu(0));
    auto reference_optimizer = sgd()(reference->parameters());
    DataParallel dp(net, {.device_ids = cpu_devices(3), .mode = mode});
    dp.set_optimizer(sgd());
    for (int step = 0; step < 6; ++step) {
      if (step == 2 || step == 4) {
        const bool freeze = step == 2;  // frozen for steps 2 and 3, trainable again from step 4
        set_frozen(*reference, {"fc2.weight", "fc3.bias"}, freeze);
        set_frozen(dp.module(), {"fc2.weight", "fc3.bias"}, freeze);
      }
      Tensor x = randn({12, 6}), y = randn({12, 3});
      reference_optimizer->zero_grad();
      mse(reference->forward(x), y).backward();
      reference_optimizer->step();
      dp.train_step(x, y, mse);
      if (step == 3) {
        for (size_t r = 0; r < 3; ++r) {
          EXPECT_FALSE(dynamic_cast<Net&>(dp.replica(r)).fc2->weight.requires_grad()) << r;
          EXPECT_FALSE(dynamic_cast<Net&>(dp.replica(r)).fc2->weight.grad().defined()) << r;
        }
      }
    }
    const nn::StateDict expected = reference->state_dict(), state = dp.module().state_dict();
    for (size_t k = 0; k < state.size(); ++k) {
      EXPECT_LT(max_relative_diff(state[k].second, expected[k].second), 1e-5) << state[k].first;
    }
  }
}

TEST(FrozenParametersTest, ChangingAReplicaOtherThanTheMasterIsRefused) {
  for (ParallelMode mode : {ParallelMode::DP, ParallelMode::DDP}) {
    manual_seed(10);
    DataParallel dp(std::make_shared<Net>(), {.device_ids = cpu_devices(2), .mode = mode});
    dp.set_optimizer(sgd());
    set_frozen(dp.replica(1), {"fc1.bias"});
    std::string e = error_of([&] { dp.train_step(randn({4, 6}), randn({4, 3}), mse); });
    EXPECT_NE(e.find("requires_grad of replica 1's 'fc1.bias' was set to false but the master's (replica 0's) is "
                     "true; change it on module()"),
              std::string::npos)
        << mode_name(mode) << ": " << e;
    set_frozen(dp.module(), {"fc1.bias"});  // now consistent: picked up
    dp.train_step(randn({4, 6}), randn({4, 3}), mse);
  }
}

// A run with frozen parameters saved and resumed continues exactly as the uninterrupted run, and the frozen
// parameters stay bit-identical through both.
TEST(FrozenParametersTest, CheckpointAndResumeAreExact) {
  const Names frozen = {"fc1.weight", "fc1.bias"};
  const std::string path = (std::filesystem::path(::testing::TempDir()) / "frozen.safetensors").string();
  for (ParallelMode mode : {ParallelMode::DP, ParallelMode::DDP}) {
    SCOPED_TRACE(mode_name(mode));
    manual_seed(11);
    auto net = std::make_shared<Net>();
    set_frozen(*net, frozen);
    const Tensor fc1_initial = net->fc1->weight.clone();
    std::vector<std::pair<Tensor, Tensor>> batches;
    for (int step = 0; step < 6; ++step) batches.emplace_back(randn({12, 6}), randn({12, 3}));
    auto engine_for = [&](std::shared_ptr<nn::Module> module) {
      auto dp = std::make_unique<DataParallel>(module, DataParallelOptions{.device_ids = cpu_devices(3), .mode = mode});
      dp->set_optimizer(adamw());
      return dp;
    };
    auto continuous = engine_for(nn::clone_module(*net, Device::cpu(0)));
    auto first_half = engine_for(nn::clone_module(*net, Device::cpu(0)));
    for (int step = 0; step < 6; ++step) continuous->train_step(batches[step].first, batches[step].second, mse);
    for (int step = 0; step < 3; ++step) first_half->train_step(batches[step].first, batches[step].second, mse);
    io::save_checkpoint(path, first_half->module(), &first_half->optimizer(0), {.epoch = 1, .step = 3});

    manual_seed(12);  // different initial values: the checkpoint must replace them all
    auto resumed_net = std::make_shared<Net>();
    set_frozen(*resumed_net, frozen);
    io::load_checkpoint(path, *resumed_net);
    auto resumed = engine_for(resumed_net);
    for (size_t r = 0; r < resumed->num_optimizers(); ++r) io::load_checkpoint(path, resumed->replica(r), &resumed->optimizer(r));
    for (int step = 3; step < 6; ++step) resumed->train_step(batches[step].first, batches[step].second, mse);

    const nn::StateDict a = continuous->module().state_dict(), b = resumed->module().state_dict();
    for (size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(equal(a[k].second, b[k].second)) << a[k].first;
    EXPECT_TRUE(equal(dynamic_cast<Net&>(resumed->module()).fc1->weight, fc1_initial));
  }
}

}  // namespace
}  // namespace dpe
