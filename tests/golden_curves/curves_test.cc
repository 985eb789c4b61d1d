// End-to-end golden loss curves: 20 training steps of an MLP and a CNN with SGD+momentum and with AdamW,
// from the same initial weights and data as tests/golden/gen_curves.py (PyTorch 1.13, float32). Every
// recorded loss (before each step) must agree within 1e-4 relative, and so must the final parameters.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/ops.h"
#include "layers/conv.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "layers/module.h"
#include "layers/pooling.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "tests/testing/golden.h"

namespace dpe {
namespace {

constexpr int kSteps = 20;
constexpr int64_t kBatch = 16;
constexpr int64_t kSamples = 64;

// Linear(32, 64) -> ReLU -> Linear(64, 10); names fc1.*, fc2.* as in the script.
class Mlp : public nn::Cloneable<Mlp> {
 public:
  Mlp() : Cloneable("Mlp") { reset(); }
  void reset() override {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(32, 64));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(64, 10));
  }
  // x: (N, 32) -> (N, 10)
  Tensor forward(const Tensor& x) override { return fc2->forward(relu(fc1->forward(x))); }
  std::shared_ptr<nn::Linear> fc1, fc2;
};

// Conv2d(1, 4, 3) -> ReLU -> MaxPool2d(2) -> flatten -> Linear(36, 10); names conv.*, fc.*.
class Cnn : public nn::Cloneable<Cnn> {
 public:
  Cnn() : Cloneable("Cnn") { reset(); }
  void reset() override {
    conv = register_module("conv", std::make_shared<nn::Conv2d>(1, 4, 3));
    pool = register_module("pool", std::make_shared<nn::MaxPool2d>(2));
    fc = register_module("fc", std::make_shared<nn::Linear>(36, 10));
  }
  // x: (N, 1, 8, 8) -> conv (N, 4, 6, 6) -> pool (N, 4, 3, 3) -> (N, 10)
  Tensor forward(const Tensor& x) override { return fc->forward(pool->forward(relu(conv->forward(x))).flatten(1)); }
  std::shared_ptr<nn::Conv2d> conv;
  std::shared_ptr<nn::MaxPool2d> pool;
  std::shared_ptr<nn::Linear> fc;
};

using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

std::unique_ptr<optim::Optimizer> make_sgd(std::vector<Tensor> params) {
  return std::make_unique<optim::SGD>(std::move(params), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
}

std::unique_ptr<optim::Optimizer> make_adamw(std::vector<Tensor> params) {
  return std::make_unique<optim::AdamW>(
      std::move(params), optim::AdamWOptions{.lr = 0.01, .betas = {0.9, 0.999}, .eps = 1e-8, .weight_decay = 0.01});
}

// Trains `model` (initialised from "<name>.init.*") for kSteps on minibatch step % 4 and compares the loss
// curve and the final parameters with "<name>_<opt>.loss" / "<name>_<opt>.final.*".
void check_curve(nn::Module& model, const std::string& name, const std::string& opt_name, const MakeOptimizer& make) {
  testing::Golden g = testing::load_golden("curves");  // tests/golden/gen_curves.py
  nn::StateDict init;
  for (const auto& [pname, t] : model.state_dict()) init.emplace_back(pname, g.tensor(name + ".init." + pname));
  model.load_state_dict(init);
  Tensor x = g.tensor(name + ".x"), y = g.tensor(name + ".y");
  std::unique_ptr<optim::Optimizer> opt = make(model.parameters());
  std::vector<float> losses;
  for (int step = 0; step < kSteps; ++step) {
    int64_t b = step % (kSamples / kBatch);
    opt->zero_grad();
    Tensor loss = nn::functional::cross_entropy(model.forward(x.narrow(0, b * kBatch, kBatch)),
                                                y.narrow(0, b * kBatch, kBatch));
    loss.backward();
    losses.push_back(static_cast<float>(loss.item()));
    opt->step();
  }
  Tensor curve = Tensor::from_vector(losses, {kSteps});
  Tensor expected = g.tensor(name + "_" + opt_name + ".loss");
  // float32 on both sides, 20 steps: summation orders differ (GEMM, reductions), so rounding differences grow
  // with training; the bound for loss curves is 1e-4 relative.
  EXPECT_LT(testing::max_relative_error(curve, expected), 1e-4)
      << name << " " << opt_name << "\n dpe:     " << curve << "\n pytorch: " << expected;
  for (const auto& [pname, p] : model.named_parameters()) {
    Tensor want = g.tensor(name + "_" + opt_name + ".final." + pname);
    // Final weights relative to each tensor's scale: single small entries are differences of updates.
    double err = max_abs_diff(p, want) / max_abs_diff(want, zeros_like(want));
    EXPECT_LT(err, 1e-4) << name << " " << opt_name << " final " << pname;
  }
}

TEST(GoldenCurvesTest, MlpSgdMomentum) {
  Mlp model;
  check_curve(model, "mlp", "sgd", make_sgd);
}

TEST(GoldenCurvesTest, MlpAdamW) {
  Mlp model;
  check_curve(model, "mlp", "adamw", make_adamw);
}

TEST(GoldenCurvesTest, CnnSgdMomentum) {
  Cnn model;
  check_curve(model, "cnn", "sgd", make_sgd);
}

TEST(GoldenCurvesTest, CnnAdamW) {
  Cnn model;
  check_curve(model, "cnn", "adamw", make_adamw);
}

}  // namespace
}  // namespace dpe
