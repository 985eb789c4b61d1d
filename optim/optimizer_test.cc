// SGD / Adam / AdamW against PyTorch trajectories (tests/golden/gen_optim.py), state_dict round trips and
// errors.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "tests/testing/golden.h"

namespace dpe::optim {
namespace {

constexpr int kSteps = 5;
constexpr int kParams = 3;

using MakeOptimizer = std::function<std::unique_ptr<Optimizer>(std::vector<Tensor>)>;

struct Config {
  std::string name;
  MakeOptimizer make;
};

std::vector<Config> configs() {
  return {
      {"sgd", [](auto ps) { return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.1}); }},
      {"sgd_momentum", [](auto ps) { return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.1, .momentum = 0.9}); }},
      {"sgd_dampening",
       [](auto ps) { return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.3}); }},
      {"sgd_nesterov",
       [](auto ps) { return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true}); }},
      {"sgd_wd",
       [](auto ps) {
         return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.1, .momentum = 0.5, .weight_decay = 0.01});
       }},
      {"adam", [](auto ps) { return std::make_unique<Adam>(ps, AdamOptions{.lr = 0.01}); }},
      {"adam_wd",
       [](auto ps) {
         return std::make_unique<Adam>(
             ps, AdamOptions{.lr = 0.01, .betas = {0.8, 0.99}, .eps = 1e-6, .weight_decay = 0.1});
       }},
      {"adamw", [](auto ps) { return std::make_unique<AdamW>(ps, AdamWOptions{.lr = 0.01, .weight_decay = 0.1}); }},
  };
}

// strided: every parameter a non-contiguous leaf (every other element of a larger tensor), which keeps SGD
// off its fused kernel and on the tensor-op path.
std::vector<Tensor> initial_params(const testing::Golden& g, bool strided = false) {
  std::vector<Tensor> ps;
  for (int i = 0; i < kParams; ++i) {
    Tensor values = g.tensor("p" + std::to_string(i));
    if (!strided) {
      ps.push_back(values.clone().set_requires_grad(true));
      continue;
    }
    Shape shape = values.shape();
    shape.push_back(2);
    Tensor holder = zeros(shape, TensorOptions(values.dtype()));
    Tensor leaf = holder.select(-1, 0).detach();
    leaf.copy_(values);
    EXPECT_FALSE(leaf.is_contiguous());
    ps.push_back(leaf.set_requires_grad(true));
  }
  return ps;
}

// Step s's gradients, as gen_optim.py sets them (parameter 2 has none at step 2).
void set_grads(const testing::Golden& g, Optimizer& opt, const std::vector<Tensor>& ps, int s) {
  opt.zero_grad();
  for (int i = 0; i < kParams; ++i) {
    if (s == 2 && i == 2) continue;
    ps[i].set_grad(g.tensor("g" + std::to_string(s) + "_" + std::to_string(i)).clone());
  }
}

TEST(OptimizerTest, MatchesPyTorchTrajectories) {
  testing::Golden g = testing::load_golden("optim");
  for (bool strided : {false, true}) {
    for (const Config& c : configs()) {
      SCOPED_TRACE(c.name + (strided ? " (strided parameters)" : ""));
      std::vector<Tensor> ps = initial_params(g, strided);
      auto opt = c.make(ps);
      for (int s = 0; s < kSteps; ++s) {
        set_grads(g, *opt, ps, s);
        opt->step();
        for (int i = 0; i < kParams; ++i) {
          const std::string key = c.name + "_s" + std::to_string(s) + "_p" + std::to_string(i);
          // float64 on both sides; PyTorch fuses some products (addcmul, addcdiv): a few ulps.
          EXPECT_LT(testing::max_relative_error(ps[i], g.tensor(key)), 1e-10) << key;
        }
      }
    }
  }
}

TEST(OptimizerTest, SgdUnitStepAndMomentumFirstStepIsGrad) {
  Tensor w = Tensor::from_vector(std::vector<double>{1, 2}, {2}).set_requires_grad(true);
  SGD opt({w}, {.lr = 0.5, .momentum = 0.9, .dampening = 0.5});
  w.set_grad(Tensor::from_vector(std::vector<double>{2, 4}, {2}));
  opt.step();  // buf = g (no dampening on the first step)
  EXPECT_EQ(w.to_vector<double>(), (std::vector<double>{0, 0}));
  opt.step();  // buf = 0.9 * g + 0.5 * g = 1.4 g
  EXPECT_EQ(w.to_vector<double>(), (std::vector<double>{-1.4, -2.8}));
}

// The fused steps group a group's parameters by device, dtype and a key (SGD: a new momentum buffer; Adam: the
// step count): float32 and float64 parameters, a strided one (the tensor-op path) and one whose first gradient
// arrives at the second step (a first step, and its own bias corrections, while the others are not) each end up,
// bitwise, where the same optimizer given that parameter alone puts it.
TEST(OptimizerTest, FusedStepsOverMixedParametersEqualEachParameterAlone) {
  auto make_params = [] {
    Tensor holder = zeros({5, 2}, TensorOptions(DType::Float64));
    Tensor strided = holder.select(-1, 0).detach();
    strided.copy_(Tensor::from_vector(std::vector<double>{1, -2, 3, -4, 5}, {5}));
    return std::vector<Tensor>{
        Tensor::from_vector(std::vector<float>{0.5f, -1.5f, 2.5f}, {3}).set_requires_grad(true),
        Tensor::from_vector(std::vector<double>{0.25, -0.75}, {2}).set_requires_grad(true),
        strided.set_requires_grad(true),
        Tensor::from_vector(std::vector<float>{-3.0f, 4.0f}, {2}).set_requires_grad(true),
        Tensor::from_vector(std::vector<double>{7, 8, 9}, {3}).set_requires_grad(true)};
  };
  const std::vector<Config> optimizers = {
      {"sgd",
       [](auto ps) {
         return std::make_unique<SGD>(ps,
                                      SGDOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.2, .weight_decay = 0.01});
       }},
      {"adam", [](auto ps) { return std::make_unique<Adam>(ps, AdamOptions{.lr = 0.01, .weight_decay = 0.1}); }},
      {"adamw", [](auto ps) { return std::make_unique<AdamW>(ps, AdamWOptions{.lr = 0.01, .weight_decay = 0.1}); }},
  };
  for (const Config& c : optimizers) {
    SCOPED_TRACE(c.name);
    std::vector<Tensor> together = make_params(), alone = make_params();
    auto opt = c.make(together);
    std::vector<std::unique_ptr<Optimizer>> singles;
    for (const Tensor& p : alone) singles.push_back(c.make({p}));
    for (int s = 0; s < 3; ++s) {
      for (size_t i = 0; i < together.size(); ++i) {
        if (s == 0 && i == 3) continue;  // parameter 3's first gradient comes at step 1
        Tensor g = full(together[i].shape(), 0.5 + static_cast<double>(s) - 0.25 * static_cast<double>(i),
                        TensorOptions(together[i].dtype()));
        together[i].set_grad(g.clone());
        alone[i].set_grad(g.clone());
      }
      opt->step();
      for (auto& single : singles) single->step();
      for (size_t i = 0; i < together.size(); ++i) {
        EXPECT_EQ(together[i].to(DType::Float64).to_vector<double>(),
                  alone[i].to(DType::Float64).to_vector<double>())
            << "parameter " << i << " after step " << s;
      }
    }
  }
}

// The fused step rounds as the tensor ops do (core/kernels/math.h): AdamW's and weight-decay-free Adam's float32
// results equal the tensor-op path's (a strided parameter takes it) bit for bit; Adam's L2 term is one fma where
// the ops round twice, so there the two agree to an ulp or so.
TEST(OptimizerTest, FusedAdamRoundsAsTheTensorOps) {
  struct Case {
    const char* name;
    bool decoupled;
    double weight_decay;
    double tolerance;
  };
  for (const Case& c :
       {Case{"AdamW", true, 0.1, 0.0}, Case{"Adam", false, 0.0, 0.0}, Case{"Adam+L2", false, 0.1, 1e-6}}) {
    SCOPED_TRACE(c.name);
    const std::vector<float> values{0.5f, -1.5f, 2.5f, 0.125f, -7.0f};
    Tensor contiguous = Tensor::from_vector(values, {5}).set_requires_grad(true);
    Tensor holder = zeros({5, 2}, TensorOptions(DType::Float32));
    Tensor strided = holder.select(-1, 0).detach();
    strided.copy_(Tensor::from_vector(values, {5}));
    strided.set_requires_grad(true);
    ASSERT_FALSE(strided.is_contiguous());
    auto make = [&](const Tensor& p) -> std::unique_ptr<Optimizer> {
      const std::vector<Tensor> ps{p};
      if (c.decoupled) return std::make_unique<AdamW>(ps, AdamWOptions{.lr = 0.01, .weight_decay = c.weight_decay});
      return std::make_unique<Adam>(ps, AdamOptions{.lr = 0.01, .weight_decay = c.weight_decay});
    };
    auto fused = make(contiguous), composed = make(strided);
    for (int s = 0; s < 4; ++s) {
      Tensor g = Tensor::from_vector(std::vector<float>{0.3f, -0.7f, 1.1f, -2.9f, 0.05f}, {5});
      contiguous.set_grad(mul(g, 1.0 + s).clone());
      strided.set_grad(mul(g, 1.0 + s).clone());
      fused->step();
      composed->step();
      const std::vector<float> a = contiguous.to_vector<float>(), b = strided.contiguous().to_vector<float>();
      for (size_t k = 0; k < a.size(); ++k) {
        EXPECT_LE(std::abs(a[k] - b[k]), c.tolerance * std::abs(b[k])) << "element " << k << " after step " << s;
      }
    }
  }
}

TEST(OptimizerTest, ZeroGradAndSkipsParamsWithoutGrad) {
  Tensor a = ones({2}, TensorOptions(DType::Float64)).set_requires_grad(true);
  Tensor b = ones({2}, TensorOptions(DType::Float64)).set_requires_grad(true);
  SGD opt({a, b}, {.lr = 1.0});
  a.set_grad(ones({2}, TensorOptions(DType::Float64)));
  opt.step();
  EXPECT_EQ(a.to_vector<double>(), (std::vector<double>{0, 0}));
  EXPECT_EQ(b.to_vector<double>(), (std::vector<double>{1, 1}));
  opt.zero_grad(/*set_to_none=*/false);
  ASSERT_TRUE(a.grad().defined());
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{0, 0}));
  opt.zero_grad();
  EXPECT_FALSE(a.grad().defined());
}

TEST(OptimizerTest, PerGroupLearningRates) {
  Tensor a = ones({1}, TensorOptions(DType::Float64)).set_requires_grad(true);
  Tensor b = ones({1}, TensorOptions(DType::Float64)).set_requires_grad(true);
  SGD opt({a}, {.lr = 0.1});
  opt.add_param_group({{b}, 0.5, {}});
  EXPECT_EQ(opt.param_groups()[1].options.at("momentum"), 0.0);  // defaults filled in
  a.set_grad(ones({1}, TensorOptions(DType::Float64)));
  b.set_grad(ones({1}, TensorOptions(DType::Float64)));
  opt.step();
  EXPECT_DOUBLE_EQ(a.item(), 0.9);
  EXPECT_DOUBLE_EQ(b.item(), 0.5);
  EXPECT_THROW(opt.add_param_group({{a}, 0.1, {}}), Error);  // already in group 0
  EXPECT_THROW(opt.add_param_group({{ones({1})}, 0.1, {{"betas", 1}}}), Error);
}

// Train 3 steps, save, load into a new optimizer on fresh parameter copies, continue: same as uninterrupted.
TEST(OptimizerTest, StateDictRoundTripContinuesTheSameTrajectory) {
  testing::Golden g = testing::load_golden("optim");
  for (const Config& c : configs()) {
    SCOPED_TRACE(c.name);
    std::vector<Tensor> ps = initial_params(g);
    auto opt = c.make(ps);
    for (int s = 0; s < 3; ++s) {
      set_grads(g, *opt, ps, s);
      opt->step();
    }
    OptimizerStateDict saved = opt->state_dict();
    std::vector<Tensor> resumed;
    for (const Tensor& p : ps) resumed.push_back(p.detach().clone().set_requires_grad(true));
    auto opt2 = c.make(resumed);
    opt2->load_state_dict(saved);
    for (int s = 3; s < kSteps; ++s) {
      set_grads(g, *opt, ps, s);
      opt->step();
      set_grads(g, *opt2, resumed, s);
      opt2->step();
    }
    for (int i = 0; i < kParams; ++i) EXPECT_TRUE(equal(ps[i], resumed[i])) << i;
  }
}

TEST(OptimizerTest, StateDictIsASnapshot) {
  Tensor w = ones({2}, TensorOptions(DType::Float64)).set_requires_grad(true);
  SGD opt({w}, {.lr = 0.1, .momentum = 0.9});
  w.set_grad(ones({2}, TensorOptions(DType::Float64)));
  opt.step();
  OptimizerStateDict sd = opt.state_dict();
  opt.step();
  EXPECT_EQ(sd.tensors.at(0).at("momentum_buffer").to_vector<double>(), (std::vector<double>{1, 1}));
}

std::string load_error(Optimizer& opt, const OptimizerStateDict& sd) {
  try {
    opt.load_state_dict(sd);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(OptimizerTest, LoadStateDictMismatchesAreClearErrorsAndChangeNothing) {
  Tensor w = ones({2, 3}, TensorOptions(DType::Float64)).set_requires_grad(true);
  AdamW opt({w}, {.lr = 0.1});
  w.set_grad(ones({2, 3}, TensorOptions(DType::Float64)));
  opt.step();
  const OptimizerStateDict good = opt.state_dict();

  Tensor v = ones({2, 3}, TensorOptions(DType::Float64)).set_requires_grad(true);
  SGD sgd({v}, {.lr = 0.1});
  EXPECT_NE(load_error(sgd, good).find("belongs to a AdamW optimizer, not SGD"), std::string::npos);

  Tensor u = ones({3, 2}, TensorOptions(DType::Float64)).set_requires_grad(true);
  AdamW other({u}, {.lr = 0.5});
  EXPECT_NE(load_error(other, good).find("has shape [2, 3] but the parameter has shape [3, 2]"), std::string::npos);
  EXPECT_EQ(other.param_groups()[0].lr, 0.5);  // untouched

  OptimizerStateDict extra = good;
  extra.tensors[5]["exp_avg"] = ones({2, 3});
  EXPECT_NE(load_error(opt, extra).find("state for parameter 5 but the optimizer has 1 parameters"),
            std::string::npos);
  OptimizerStateDict unknown = good;
  unknown.tensors[0]["momentum_buffer"] = ones({2, 3});
  EXPECT_NE(load_error(opt, unknown).find("unknown state tensor 'momentum_buffer'"), std::string::npos);
  OptimizerStateDict partial = good;
  partial.tensors[0].erase("exp_avg_sq");
  EXPECT_NE(load_error(opt, partial).find("parameter 0 has state but lacks state tensor 'exp_avg_sq'"),
            std::string::npos);
  OptimizerStateDict no_step = good;
  no_step.scalars.clear();
  EXPECT_NE(load_error(opt, no_step).find("lacks state scalar 'step'"), std::string::npos);
  OptimizerStateDict groups = good;
  groups.param_groups.push_back(groups.param_groups[0]);
  EXPECT_NE(load_error(opt, groups).find("the state has 2 param groups, the optimizer 1"), std::string::npos);
}

// Regression: a state with a NaN or negative hyper-parameter loaded silently and
// failed at the first step. load_state_dict refuses it (Note [Hyper-parameter ranges]) and changes nothing.
TEST(OptimizerTest, LoadStateDictRefusesHyperParametersOutOfRange) {
  Tensor w = ones({2, 3}, TensorOptions(DType::Float64)).set_requires_grad(true);
  AdamW adam({w}, {.lr = 0.1});
  w.set_grad(ones({2, 3}, TensorOptions(DType::Float64)));
  adam.step();
  const OptimizerStateDict good = adam.state_dict();
  auto with = [&](const std::function<void(OptimizerStateDict&)>& change) {
    OptimizerStateDict sd = good;
    change(sd);
    return load_error(adam, sd);
  };
  EXPECT_NE(with([](auto& sd) { sd.param_groups[0].lr = std::nan(""); })
                .find("AdamW.load_state_dict: param group 0 has lr nan; expected a finite number >= 0"),
            std::string::npos);
  EXPECT_NE(with([](auto& sd) { sd.param_groups[0].lr = -0.1; }).find("has lr -0.1; expected"), std::string::npos);
  EXPECT_NE(with([](auto& sd) { sd.param_groups[0].options["beta2"] = 1.0; })
                .find("param group 0 has beta2 1; expected a number in [0, 1)"),
            std::string::npos);
  EXPECT_NE(with([](auto& sd) { sd.param_groups[0].options["eps"] = -1e-8; }).find("has eps -1e-08; expected"),
            std::string::npos);
  EXPECT_NE(with([](auto& sd) { sd.scalars[0]["step"] = -3; })
                .find("state scalar 'step' of parameter 0 is -3; expected a whole number in [0, 2^53]"),
            std::string::npos);
  EXPECT_EQ(adam.param_groups()[0].lr, 0.1);  // untouched
  EXPECT_EQ(adam.state_dict().scalars.at(0).at("step"), 1.0);

  Tensor v = ones({2}, TensorOptions(DType::Float64)).set_requires_grad(true);
  SGD sgd({v}, {.lr = 0.1, .momentum = 0.9});
  OptimizerStateDict sd = sgd.state_dict();
  sd.param_groups[0].options["momentum"] = -0.9;
  EXPECT_NE(load_error(sgd, sd).find("SGD.load_state_dict: param group 0 has momentum -0.9; expected a finite "
                                     "number >= 0"),
            std::string::npos);
  sd = sgd.state_dict();
  sd.param_groups[0].options["nesterov"] = 1;
  sd.param_groups[0].options["dampening"] = 0.5;
  EXPECT_NE(load_error(sgd, sd).find("param group 0: nesterov requires momentum > 0 and dampening 0"),
            std::string::npos);
  sd = sgd.state_dict();
  sd.param_groups[0].lr = std::numeric_limits<double>::infinity();
  EXPECT_NE(load_error(sgd, sd).find("has lr inf; expected a finite number >= 0"), std::string::npos);
  EXPECT_EQ(sgd.param_groups()[0].options.at("momentum"), 0.9);
}

TEST(OptimizerTest, InvalidOptionsAreErrors) {
  Tensor w = ones({1}).set_requires_grad(true);
  EXPECT_THROW(SGD({w}, {.lr = 0.1, .nesterov = true}), Error);
  EXPECT_THROW(SGD({w}, {.lr = -1}), Error);
  EXPECT_THROW(Adam({w}, {.betas = {1.0, 0.9}}), Error);
  EXPECT_THROW(SGD({w, w}, {.lr = 0.1}), Error);  // duplicate parameter
}

}  // namespace
}  // namespace dpe::optim
