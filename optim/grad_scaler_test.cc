// GradScaler against PyTorch's torch.amp.GradScaler behaviour: skipped steps on inf/NaN leave parameters and
// optimizer state untouched bit for bit, the scale's backoff/growth sequence, exact unscaling for a
// power-of-two scale, the once-per-iteration rules, state_dict round trips, option validation, and the
// disabled pass-through.
#include "optim/grad_scaler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/ops.h"
#include "layers/linear.h"
#include "optim/sgd.h"
#include "tests/testing/errors.h"

namespace dpe::optim {
namespace {

using testing::error_of;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

void expect_error(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "message: " << message << "\nexpected to contain: " << part;
}

// Two float32 parameters with gradients `scale` x the fixed values g0, g1 (as a scaled backward leaves them).
struct Params {
  Tensor p0 = Tensor::from_vector(std::vector<float>{1, -2, 3, 0.5f}, {2, 2}).set_requires_grad(true);
  Tensor p1 = Tensor::from_vector(std::vector<float>{0.25f, 4, -1}, {3}).set_requires_grad(true);
  void set_grads(double scale, float g1_last = 0.75f) const {
    p0.set_grad(Tensor::from_vector(std::vector<float>{0.1f, -0.2f, 0.3f, 0.4f}, {2, 2}) * scale);
    p1.set_grad(Tensor::from_vector(std::vector<float>{-0.5f, 0.6f, g1_last}, {3}) * scale);
  }
  std::vector<Tensor> all() const { return {p0, p1}; }
};

std::vector<Tensor> clones(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) out.push_back(t.detach().clone());
  return out;
}

TEST(GradScaler, DefaultsArePyTorchs) {
  GradScaler scaler;
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  EXPECT_EQ(scaler.options().growth_factor, 2.0);
  EXPECT_EQ(scaler.options().backoff_factor, 0.5);
  EXPECT_EQ(scaler.options().growth_interval, 2000);
  EXPECT_TRUE(scaler.is_enabled());
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScaler, ScaleMultipliesTheLossDifferentiably) {
  GradScaler scaler({.init_scale = 1024});
  Tensor w = Tensor::from_vector(std::vector<float>{2, -3}, {2}).set_requires_grad(true);
  Tensor loss = sum(w * w);  // d/dw = 2w
  Tensor scaled = scaler.scale(loss);
  EXPECT_EQ(scaled.item(), 13.0 * 1024);
  scaled.backward();
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{4096, -6144}));
}

TEST(GradScaler, UnscaledGradientsAreExactlyGradOverScale) {
  Params ps;
  SGD opt(ps.all(), {.lr = 0.1});
  GradScaler scaler;
  // Random gradients (not multiples of the scale): dividing by a power of two is exact in float32.
  manual_seed(5);
  Tensor g0 = randn({2, 2}) * 1000.0, g1 = randn({3}) * 1e-3;
  ps.p0.set_grad(g0.clone());
  ps.p1.set_grad(g1.clone());
  scaler.unscale_(opt);
  EXPECT_TRUE(equal(ps.p0.grad(), g0 / 65536.0));
  EXPECT_TRUE(equal(ps.p1.grad(), g1 / 65536.0));
  EXPECT_TRUE(scaler.step(opt));  // does not unscale a second time
  scaler.update();
  EXPECT_TRUE(equal(ps.p0.grad(), g0 / 65536.0));
}

TEST(GradScaler, AStepMatchesTheUnscaledStep) {
  Params scaled, plain;
  SGD scaled_opt(scaled.all(), {.lr = 0.1, .momentum = 0.9});
  SGD plain_opt(plain.all(), {.lr = 0.1, .momentum = 0.9});
  GradScaler scaler;
  for (int step = 0; step < 3; ++step) {
    scaled.set_grads(scaler.get_scale());
    plain.set_grads(1.0);
    EXPECT_TRUE(scaler.step(scaled_opt));
    scaler.update();
    plain_opt.step();
  }
  EXPECT_TRUE(equal(scaled.p0, plain.p0));
  EXPECT_TRUE(equal(scaled.p1, plain.p1));
}

TEST(GradScaler, AnInfOrNanGradientSkipsTheStepAndBacksOff) {
  for (float bad : {kInf, -kInf, kNan}) {
    SCOPED_TRACE(bad);
    Params ps;
    SGD opt(ps.all(), {.lr = 0.1, .momentum = 0.9});
    GradScaler scaler;
    ps.set_grads(scaler.get_scale());
    ASSERT_TRUE(scaler.step(opt));  // a clean step first, so that the momentum buffers exist
    scaler.update();
    const std::vector<Tensor> params_before = clones(ps.all());
    const OptimizerStateDict state_before = opt.state_dict();

    ps.set_grads(scaler.get_scale(), bad);  // one element of p1's gradient overflowed
    EXPECT_FALSE(scaler.step(opt));
    scaler.update();
    EXPECT_TRUE(equal(ps.p0, params_before[0]));
    EXPECT_TRUE(equal(ps.p1, params_before[1]));
    const OptimizerStateDict state_after = opt.state_dict();
    for (int64_t i : {0, 1}) {
      EXPECT_TRUE(equal(state_after.tensors.at(i).at("momentum_buffer"), state_before.tensors.at(i).at("momentum_buffer")));
    }
    EXPECT_EQ(scaler.get_scale(), 32768.0);
    EXPECT_EQ(scaler.growth_tracker(), 0);
  }
}

TEST(GradScaler, FiniteGradientsWhoseSumOverflowsAreNotInf) {
  // Every element is finite; their sum overflows float32. PyTorch checks elements, not sums.
  Tensor p = zeros({1000}).set_requires_grad(true);
  p.set_grad(full({1000}, 3e38));
  SGD opt({p}, {.lr = 0.0});
  GradScaler scaler({.init_scale = 1.0});
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1.0);
}

// PyTorch's _amp_update_scale_, by hand: init 8, x2 after 3 clean iterations, x0.5 on inf.
TEST(GradScaler, ScaleSequenceGrowsAfterTheIntervalAndBacksOffOnInf) {
  struct Iteration {
    bool inf;
    double scale_after;
    int64_t tracker_after;
  };
  const Iteration golden[] = {{false, 8, 1},  {false, 8, 2},  {false, 16, 0}, {false, 16, 1}, {true, 8, 0},
                              {false, 8, 1},  {false, 8, 2},  {true, 4, 0},   {false, 4, 1},  {false, 4, 2},
                              {false, 8, 0},  {false, 8, 1}};
  Params ps;
  SGD opt(ps.all(), {.lr = 0.01});
  GradScaler scaler({.init_scale = 8, .growth_interval = 3});
  for (size_t i = 0; i < std::size(golden); ++i) {
    ps.set_grads(scaler.get_scale(), golden[i].inf ? kInf : 0.75f);
    EXPECT_EQ(scaler.step(opt), !golden[i].inf) << "iteration " << i;
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), golden[i].scale_after) << "iteration " << i;
    EXPECT_EQ(scaler.growth_tracker(), golden[i].tracker_after) << "iteration " << i;
  }
}

TEST(GradScaler, AScaleThatWouldOverflowFloat32DoesNotGrow) {
  Params ps;
  SGD opt(ps.all(), {.lr = 0.0});
  GradScaler scaler({.init_scale = 0x1p127, .growth_interval = 1});
  ps.set_grads(1.0);
  scaler.step(opt);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 0x1p127);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScaler, OncePerIterationRules) {
  Params ps;
  SGD opt(ps.all(), {.lr = 0.1});
  GradScaler scaler;
  expect_error(error_of([&] { scaler.update(); }), "no inf checks were recorded");
  ps.set_grads(scaler.get_scale());
  scaler.unscale_(opt);
  expect_error(error_of([&] { scaler.unscale_(opt); }), "unscale_() has already been called");
  scaler.step(opt);
  expect_error(error_of([&] { scaler.step(opt); }), "step() has already been called");
  expect_error(error_of([&] { scaler.unscale_(opt); }), "after step()");
  scaler.update();
  ps.set_grads(scaler.get_scale());
  EXPECT_TRUE(scaler.step(opt));  // a new iteration
  scaler.update();
}

TEST(GradScaler, RecordedFlagsDecideEachOptimizerAndUpdateCombinesThem) {
  // What an engine does with two replicas' optimizers: it unscales each replica's gradients itself, combines
  // the flags, and records the combined flag for every optimizer.
  Params a, b;
  SGD opt_a(a.all(), {.lr = 0.1}), opt_b(b.all(), {.lr = 0.1});
  GradScaler scaler;
  a.set_grads(scaler.get_scale());
  b.set_grads(scaler.get_scale(), kNan);
  const std::vector<Tensor> a_before = clones(a.all());
  const bool found_a = scaler.unscale_grads({a.p0.grad(), a.p1.grad()});
  const bool found_b = scaler.unscale_grads({b.p0.grad(), b.p1.grad()});
  EXPECT_FALSE(found_a);
  EXPECT_TRUE(found_b);
  scaler.record_unscaled(opt_a, found_a || found_b);
  scaler.record_unscaled(opt_b, found_a || found_b);
  scaler.record_unscaled(opt_a, false);  // OR-ed: the flag stays set
  EXPECT_EQ(scaler.recorded_found_inf(opt_a), std::optional<bool>(true));
  EXPECT_FALSE(scaler.step(opt_a));  // not unscaled again, and skipped: b's NaN decides for both
  EXPECT_FALSE(scaler.step(opt_b));
  expect_error(error_of([&] { scaler.record_unscaled(opt_a, false); }), "after step()");
  scaler.update();
  EXPECT_EQ(scaler.recorded_found_inf(opt_a), std::nullopt);
  EXPECT_TRUE(equal(a.p0, a_before[0]));
  EXPECT_EQ(scaler.get_scale(), 32768.0);
}

TEST(GradScaler, RecordUnscaledAfterUnscaleCombinesTheFlags) {
  // An engine combining flags over replicas after its user unscale_'d an optimizer (to clip gradients).
  Params ps;
  SGD opt(ps.all(), {.lr = 0.1});
  GradScaler scaler;
  ps.set_grads(scaler.get_scale());
  const std::vector<Tensor> before = clones(ps.all());
  scaler.unscale_(opt);
  EXPECT_EQ(scaler.recorded_found_inf(opt), std::optional<bool>(false));
  scaler.record_unscaled(opt, true);  // another replica found an inf
  EXPECT_FALSE(scaler.step(opt));
  scaler.update();
  EXPECT_TRUE(equal(ps.p0, before[0]));
  EXPECT_EQ(scaler.get_scale(), 32768.0);
}

TEST(GradScaler, UnscaleGradsRefusesWhatTheKernelCannotTake) {
  GradScaler scaler;
  Tensor ints = zeros({3}, TensorOptions(DType::Int64));
  expect_error(error_of([&] { scaler.unscale_grads({ints}); }), "gradient 0 [3] is int64");
  Tensor t = zeros({2, 3}).transpose(0, 1);
  expect_error(error_of([&] { scaler.unscale_grads({zeros({1}), t}); }), "gradient 1 [3, 2] is not contiguous");
}

TEST(GradScaler, StateDictRoundTrip) {
  Params ps;
  SGD opt(ps.all(), {.lr = 0.1});
  GradScaler scaler({.init_scale = 256, .growth_factor = 4, .backoff_factor = 0.25, .growth_interval = 5});
  for (int i = 0; i < 2; ++i) {
    ps.set_grads(scaler.get_scale());
    scaler.step(opt);
    scaler.update();
  }
  const GradScalerStateDict state = scaler.state_dict();
  EXPECT_EQ(state, (GradScalerStateDict{{"scale", 256}, {"growth_factor", 4}, {"backoff_factor", 0.25},
                                        {"growth_interval", 5}, {"growth_tracker", 2}}));
  GradScaler restored;
  restored.load_state_dict(state);
  EXPECT_EQ(restored.state_dict(), state);
  // The restored scaler continues the same sequence: 3 more clean iterations grow the scale x4.
  for (int i = 0; i < 3; ++i) {
    ps.set_grads(restored.get_scale());
    restored.step(opt);
    restored.update();
  }
  EXPECT_EQ(restored.get_scale(), 1024.0);
}

TEST(GradScaler, LoadStateDictRefusesBadStatesAndChangesNothing) {
  GradScaler scaler;
  const GradScalerStateDict good = GradScaler({.init_scale = 4}).state_dict();
  auto with = [&](const std::string& key, double value) {
    GradScalerStateDict s = good;
    s[key] = value;
    return s;
  };
  GradScalerStateDict missing = good;
  missing.erase("growth_tracker");
  expect_error(error_of([&] { scaler.load_state_dict(missing); }), "no 'growth_tracker'");
  expect_error(error_of([&] { scaler.load_state_dict(with("_growth_tracker", 0)); }), "unknown key '_growth_tracker'");
  expect_error(error_of([&] { scaler.load_state_dict(with("scale", -1)); }), "scale must be finite and > 0 as a float32, got -1");
  expect_error(error_of([&] { scaler.load_state_dict(with("growth_tracker", 1.5)); }), "growth_tracker must be a whole number >= 0, got 1.5");
  expect_error(error_of([&] { scaler.load_state_dict(with("growth_interval", 0)); }), "growth_interval must be a whole number >= 1, got 0");
  expect_error(error_of([&] { scaler.load_state_dict({}); }), "saved from a disabled GradScaler");
  EXPECT_EQ(scaler.get_scale(), 65536.0);
}

TEST(GradScaler, OptionsAreValidated) {
  expect_error(error_of([] { GradScaler({.init_scale = 0}); }), "init_scale must be finite and > 0 as a float32, got 0");
  expect_error(error_of([] { GradScaler({.init_scale = 1e39}); }), "got 1e+39");
  expect_error(error_of([] { GradScaler({.init_scale = std::nan("")}); }), "init_scale");
  expect_error(error_of([] { GradScaler({.growth_factor = 1.0}); }), "growth_factor must be > 1, got 1");
  expect_error(error_of([] { GradScaler({.backoff_factor = 1.0}); }), "backoff_factor must be in (0, 1), got 1");
  expect_error(error_of([] { GradScaler({.backoff_factor = 0.0}); }), "backoff_factor must be in (0, 1), got 0");
  expect_error(error_of([] { GradScaler({.growth_interval = 0}); }), "growth_interval must be a whole number >= 1, got 0");
}

TEST(GradScaler, DisabledIsAPassThrough) {
  Params ps, plain;
  SGD opt(ps.all(), {.lr = 0.1}), plain_opt(plain.all(), {.lr = 0.1});
  GradScaler scaler({.enabled = false});
  Tensor loss = full({}, 3.0);
  EXPECT_EQ(scaler.scale(loss).item(), 3.0);
  EXPECT_EQ(scaler.get_scale(), 1.0);
  ps.set_grads(1.0, kInf);  // not even an inf stops a disabled scaler (as in PyTorch)
  plain.set_grads(1.0, kInf);
  scaler.unscale_(opt);
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  plain_opt.step();
  EXPECT_TRUE(equal(ps.p0, plain.p0));
  EXPECT_TRUE(scaler.state_dict().empty());
  scaler.load_state_dict({});  // nothing to load into, as in PyTorch
  EXPECT_EQ(scaler.get_scale(), 1.0);
}

}  // namespace
}  // namespace dpe::optim
