#include "layers/loss.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/allocator.h"
#include "core/device.h"
#include "core/error.h"
#include "core/ops.h"
#include "tests/testing/golden.h"
#include "tests/testing/gradcheck.h"
#include "tests/testing/errors.h"

namespace dpe::nn::functional {
namespace {

using testing::max_relative_error;

Tensor labels(const std::vector<int64_t>& v) { return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}); }

using dpe::testing::error_of;

TEST(LossTest, CrossEntropyUnitValues) {
  // Uniform logits over 4 classes: -log(1/4) per sample whatever the target.
  Tensor logits = zeros({3, 4});
  EXPECT_NEAR(cross_entropy(logits, labels({0, 1, 3})).item(), std::log(4.0), 1e-6);
  EXPECT_NEAR(cross_entropy(logits, labels({0, 1, 3}), {.reduction = Reduction::Sum}).item(), 3 * std::log(4.0),
              1e-5);
  Tensor none = cross_entropy(logits, labels({0, -100, 3}), {.reduction = Reduction::None});
  EXPECT_EQ(none.shape(), (Shape{3}));
  EXPECT_FLOAT_EQ(none.to_vector<float>()[1], 0.0f);  // ignored position
  // Mean divides by the 2 non-ignored targets, not 3.
  EXPECT_NEAR(cross_entropy(logits, labels({0, -100, 3})).item(), std::log(4.0), 1e-6);
}

TEST(LossTest, NllLossPicksTargetAndUnbatchedInput) {
  Tensor lp = Tensor::from_vector(std::vector<double>{-1, -2, -3, -4, -5, -6}, {2, 3});
  EXPECT_DOUBLE_EQ(nll_loss(lp, labels({2, 0})).item(), (3 + 4) / 2.0);
  Tensor one = Tensor::from_vector(std::vector<double>{-1, -2, -3}, {3});
  Tensor t0 = Tensor::from_vector(std::vector<int64_t>{1}, {});
  EXPECT_DOUBLE_EQ(nll_loss(one, t0).item(), 2.0);
  EXPECT_EQ(nll_loss(one, t0, {.reduction = Reduction::None}).shape(), Shape{});
}

TEST(LossTest, MseLossUnitValues) {
  Tensor a = Tensor::from_vector(std::vector<double>{1, 2, 3, 4}, {2, 2});
  Tensor b = Tensor::from_vector(std::vector<double>{0, 2, 5, 4}, {2, 2});
  EXPECT_DOUBLE_EQ(mse_loss(a, b).item(), (1 + 0 + 4 + 0) / 4.0);
  EXPECT_DOUBLE_EQ(mse_loss(a, b, Reduction::Sum).item(), 5.0);
  EXPECT_EQ(mse_loss(a, b, Reduction::None).to_vector<double>(), (std::vector<double>{1, 0, 4, 0}));
}

TEST(LossTest, MatchesPyTorch) {
  testing::Golden g = testing::load_golden("loss");  // tests/golden/gen_loss.py
  struct Case {
    std::string prefix;
    std::string input;
    std::string target;
    std::function<Tensor(const Tensor&, const Tensor&)> fn;
  };
  auto ce = [](Reduction r, double ls) {
    return [r, ls](const Tensor& x, const Tensor& t) {
      return cross_entropy(x, t, {.reduction = r, .label_smoothing = ls});
    };
  };
  std::vector<Case> cases;
  const std::pair<const char*, Reduction> reductions[] = {
      {"mean", Reduction::Mean}, {"sum", Reduction::Sum}, {"none", Reduction::None}};
  for (auto [name, r] : reductions) {
    const std::string n = name;
    cases.push_back({"ce_" + n, "logits", "target", ce(r, 0.0)});
    cases.push_back({"ce_ls_" + n, "logits", "target", ce(r, 0.2)});
    cases.push_back({"nll_" + n, "log_probs", "target",
                     [r](const Tensor& x, const Tensor& t) { return nll_loss(x, t, {.reduction = r}); }});
    cases.push_back({"ce4_" + n, "logits4", "target4", ce(r, 0.0)});
    cases.push_back({"ce4_ls_" + n, "logits4", "target4", ce(r, 0.1)});
    cases.push_back({"mse_" + n, "mse_a", "mse_b",
                     [r](const Tensor& x, const Tensor& t) { return mse_loss(x, t, r); }});
  }
  cases.push_back({"ce_ignore3", "logits", "target_ignore3",
                   [](const Tensor& x, const Tensor& t) { return cross_entropy(x, t, {.ignore_index = 3}); }});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.prefix);
    Tensor x = g.tensor(c.input).clone().set_requires_grad(true);
    Tensor y = c.fn(x, g.tensor(c.target));
    y.backward(g.tensor(c.prefix + "_dy"));
    // float64 on both sides: only summation order differs.
    EXPECT_LT(max_relative_error(y, g.tensor(c.prefix + "_y")), 1e-10);
    EXPECT_LT(max_relative_error(x.grad(), g.tensor(c.prefix + "_dx")), 1e-10);
  }
}

TEST(LossTest, AllIgnoredMatchesPyTorch) {
  testing::Golden g = testing::load_golden("loss");
  Tensor logits = g.tensor("logits").narrow(0, 0, 3);
  Tensor t = labels({-100, -100, -100});
  EXPECT_TRUE(std::isnan(g.tensor("all_ignored_mean").item()));  // what torch 1.13 does
  EXPECT_TRUE(std::isnan(cross_entropy(logits, t).item()));
  EXPECT_TRUE(std::isnan(cross_entropy(logits, t, {.label_smoothing = 0.1}).item()));
  EXPECT_EQ(cross_entropy(logits, t, {.reduction = Reduction::Sum}).item(), g.tensor("all_ignored_sum").item());
}

TEST(LossTest, Gradcheck) {
  Tensor x = testing::randn_leaf({4, 5}, 1);
  Tensor t = labels({1, -100, 4, 0});
  for (double ls : {0.0, 0.3}) {
    EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) {
                return cross_entropy(in[0], t, {.reduction = Reduction::None, .label_smoothing = ls});
              }, {x}), "");
    EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) {
                return cross_entropy(in[0], t, {.label_smoothing = ls});
              }, {x}), "");
  }
  Tensor wide = testing::randn_leaf({3, 40}, 5);  // a row past the vectorised length
  Tensor tw = labels({39, -100, 0});
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return cross_entropy(in[0], tw); }, {wide}), "");
  Tensor x4 = testing::randn_leaf({2, 3, 2, 2}, 2);
  Tensor t4 = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 2, 1, 0, -100, 1}, {2, 2, 2});
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return cross_entropy(in[0], t4); }, {x4}), "");
  Tensor a = testing::randn_leaf({3, 4}, 3), b = testing::randn_leaf({3, 4}, 4);
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return mse_loss(in[0], in[1]); }, {a, b}), "");
}

// cross_entropy's mean over (N, C) logits on CPU devices is one fused op (core/ops/loss_ops.h cross_entropy_mean):
// the same bits as log_softmax then nll_loss, forward and backward, for rows below and above the vectorised
// length, float32 and float64, ignored targets; and no (N, C) tensor made by the forward.
TEST(LossTest, FusedCrossEntropyIsTheCompositionBitForBit) {
  for (const auto& [classes, dtype] : std::vector<std::pair<int64_t, DType>>{
           {10, DType::Float32}, {33, DType::Float32}, {259, DType::Float32}, {1000, DType::Float32},
           {7, DType::Float64}, {300, DType::Float64}}) {
    manual_seed(static_cast<uint64_t>(classes));
    const int64_t rows = 37;
    Tensor x = mul(randn({rows, classes}, TensorOptions(dtype)), 4.0);
    std::vector<int64_t> t(rows);
    for (int64_t n = 0; n < rows; ++n) t[n] = n % 5 == 3 ? -100 : (n * 7919) % classes;
    Tensor target = labels(t);
    Tensor a = x.detach().set_requires_grad(true), b = x.detach().set_requires_grad(true);
    Tensor fused = cross_entropy(a, target);
    Tensor composed = nll_loss(log_softmax(b, 1), target);
    ASSERT_TRUE(equal(fused, composed)) << classes << " " << fused.item() << " " << composed.item();
    mul(fused, 3.0).backward();
    mul(composed, 3.0).backward();
    EXPECT_TRUE(equal(a.grad(), b.grad())) << classes << ": max relative difference "
                                           << max_relative_error(a.grad(), b.grad());
  }
  // The forward holds three numbers per row beside the logits, not the (N, C) log-probabilities.
  const Device d = Device::cpu(0);
  Tensor x = randn({256, 4096}).set_requires_grad(true);
  const int64_t before = memory_stats(d).allocated_bytes;
  Tensor loss = cross_entropy(x, labels(std::vector<int64_t>(256, 5)));
  EXPECT_LT(memory_stats(d).allocated_bytes - before, 256 * 4096 * 4 / 8);
}

// On CUDA devices the fused cross-entropy mean (two kernels forward, one backward) gives the bits of the CUDA
// composition, log_softmax then nll_loss: rows below and above a block's 256 threads, more rows than the mean
// kernel's threads and than the row kernels' 65,536 blocks, ignored targets, every target ignored (NaN); and the
// forward makes no (N, C) tensor.
TEST(LossTest, FusedCrossEntropyIsTheCompositionBitForBitOnCuda) {
  if (!dpe::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  struct Case {
    int64_t rows, classes;
    DType dtype;
    bool all_ignored;
  };
  for (const Case& c : {Case{37, 10, DType::Float32, false}, Case{300, 1000, DType::Float32, false},
                        Case{37, 50304, DType::Float32, false}, Case{9, 300, DType::Float64, false},
                        Case{5, 7, DType::Float32, true}, Case{70000, 3, DType::Float32, false}}) {
    manual_seed(static_cast<uint64_t>(c.classes));
    Tensor x = mul(randn({c.rows, c.classes}, TensorOptions(c.dtype)), 4.0).to(gpu);
    std::vector<int64_t> t(static_cast<size_t>(c.rows));
    for (int64_t n = 0; n < c.rows; ++n) t[n] = c.all_ignored || n % 5 == 3 ? -100 : (n * 7919) % c.classes;
    Tensor target = labels(t).to(gpu);
    Tensor a = x.detach().set_requires_grad(true), b = x.detach().set_requires_grad(true);
    Tensor fused = cross_entropy(a, target);
    Tensor composed = nll_loss(log_softmax(b, 1), target);
    const double f = fused.item(), r = composed.item();
    EXPECT_TRUE(f == r || (std::isnan(f) && std::isnan(r))) << c.classes << ": " << f << " vs " << r;
    mul(fused, 3.0).backward();
    mul(composed, 3.0).backward();
    EXPECT_TRUE(equal(a.grad(), b.grad())) << c.classes << ": max relative difference "
                                           << max_relative_error(a.grad(), b.grad());
  }
  Tensor x = randn({256, 4096}).to(gpu).set_requires_grad(true);
  Tensor target = labels(std::vector<int64_t>(256, 5)).to(gpu);
  const int64_t before = memory_stats(gpu).allocated_bytes;
  Tensor loss = cross_entropy(x, target);
  EXPECT_LT(memory_stats(gpu).allocated_bytes - before, 256 * 4096 * 4 / 8);
}

TEST(LossTest, ErrorsNameShapesAndValues) {
  Tensor logits = zeros({5, 10});
  EXPECT_NE(error_of([&] { cross_entropy(logits, labels({0, 1, 2, 3})); })
                .find("cross_entropy: target [4] does not match logits [5, 10]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { cross_entropy(logits, labels({0, 1, 12, 3, 4})); })
                .find("target 12 is out of bounds for 10 classes"),
            std::string::npos);
  EXPECT_NE(error_of([&] { nll_loss(logits, labels({0, 1, -1, 3, 4})); }).find("target -1 is out of bounds"),
            std::string::npos);
  EXPECT_NE(error_of([&] { cross_entropy(logits, zeros({5})); }).find("must be int64"), std::string::npos);
  EXPECT_NE(error_of([&] { cross_entropy(logits, labels({0, 1, 2, 3, 4}), {.label_smoothing = 1.5}); })
                .find("label_smoothing must be in [0, 1], got 1.5"),
            std::string::npos);
  EXPECT_NE(error_of([&] { mse_loss(zeros({2, 3}), zeros({4})); }).find("not broadcastable"), std::string::npos);
}

TEST(LossTest, CudaMatchesCpu) {
  if (!dpe::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::parse("cuda:0");
  Tensor x = testing::randn_leaf({3, 4, 5}, 7);
  Tensor t = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, -100, 3, 2, 1, 0, 0, 1, 2, 3, 3, 2}, {3, 5});
  for (double ls : {0.0, 0.25}) {
    Tensor xg = x.detach().to(gpu).set_requires_grad(true);
    Tensor y_cpu = cross_entropy(x, t, {.label_smoothing = ls});
    Tensor y_gpu = cross_entropy(xg, t.to(gpu), {.label_smoothing = ls});
    y_cpu.backward();
    y_gpu.backward();
    // float64; the GPU's log_softmax sums in another order: agreement to a few ulps.
    EXPECT_LT(max_relative_error(y_gpu.to(Device::cpu(0)), y_cpu), 1e-12);
    EXPECT_LT(max_relative_error(xg.grad().to(Device::cpu(0)), x.grad()), 1e-12);
    x.set_grad(Tensor());
  }
  // reduction='mean' is one kernel each way on CUDA (nll_loss_mean): nll_loss too, and every target ignored
  // (NaN, zero gradients on both).
  Tensor lp = testing::randn_leaf({6, 4}, 9);
  for (const std::vector<int64_t>& targets :
       {std::vector<int64_t>{3, 0, 2, -100, 1, 1}, std::vector<int64_t>(6, -100)}) {
    Tensor tt = Tensor::from_vector(targets, {6});
    Tensor lpg = lp.detach().to(gpu).set_requires_grad(true);
    Tensor y_cpu = nll_loss(lp, tt), y_gpu = nll_loss(lpg, tt.to(gpu));
    y_cpu.backward();
    y_gpu.backward();
    const double want = y_cpu.item(), got = y_gpu.item();
    EXPECT_TRUE(std::isnan(want) ? std::isnan(got) : std::abs(got - want) <= 1e-12 * std::abs(want))
        << got << " " << want;
    EXPECT_EQ(lpg.grad().to(Device::cpu(0)).to_vector<double>(), lp.grad().to_vector<double>());
    lp.set_grad(Tensor());
  }
  Tensor bad = Tensor::from_vector(std::vector<int64_t>{0, 9, 1}, {3}).to(gpu);
  EXPECT_NE(error_of([&] { cross_entropy(zeros({3, 4}, TensorOptions(gpu)), bad); })
                .find("target 9 is out of bounds for 4 classes"),
            std::string::npos);
}

}  // namespace
}  // namespace dpe::nn::functional
