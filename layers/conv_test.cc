// Conv2d and the pooling layers: shapes and default init, gradient checks, and PyTorch golden values
// (tests/golden/gen_conv.py).
#include "layers/conv.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops.h"
#include "layers/pooling.h"
#include "tests/testing/golden.h"
#include "tests/testing/gradcheck.h"

namespace dpe::nn {
namespace {

TEST(Conv2dLayerTest, ShapesAndParameters) {
  Conv2d conv(3, 8, 3, 2, 1);
  EXPECT_EQ(conv.weight.shape(), (Shape{8, 3, 3, 3}));
  EXPECT_EQ(conv.bias.shape(), (Shape{8}));
  EXPECT_EQ(conv.forward(zeros({2, 3, 9, 9})).shape(), (Shape{2, 8, 5, 5}));
  EXPECT_EQ(conv.forward(zeros({3, 9, 9})).shape(), (Shape{8, 5, 5}));
  auto names = conv.named_parameters();
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[0].first, "weight");
  EXPECT_EQ(names[1].first, "bias");

  Conv2d grouped(Conv2dOptions{4, 6, {3, 2}, {1, 1}, {0, 0}, {1, 1}, 2, false});
  EXPECT_EQ(grouped.weight.shape(), (Shape{6, 2, 3, 2}));
  EXPECT_FALSE(grouped.bias.defined());
  EXPECT_EQ(grouped.parameters().size(), 1u);
}

TEST(Conv2dLayerTest, DefaultInitIsUniformWithinFanInBound) {
  manual_seed(0);
  // fan_in = in_channels / groups * kH * kW = 8 / 2 * 5 * 5 = 100: bound 0.1.
  Conv2d conv(Conv2dOptions{8, 16, {5, 5}, {1, 1}, {0, 0}, {1, 1}, 2});
  for (float w : conv.weight.to_vector<float>()) EXPECT_LE(std::abs(w), 0.1f);
  for (float b : conv.bias.to_vector<float>()) EXPECT_LE(std::abs(b), 0.1f);
  EXPECT_GT(max(conv.weight).item(), 0.09);  // it really spans the range
  EXPECT_LT(min(conv.weight).item(), -0.09);
}

TEST(Conv2dLayerTest, CloneCopiesValues) {
  Conv2d conv(2, 3, 3);
  auto copy = clone_module(conv, Device::cpu(1));
  EXPECT_EQ(copy->weight.device(), Device::cpu(1));
  EXPECT_TRUE(equal(copy->weight.to(Device::cpu(0)), conv.weight));
  EXPECT_EQ(copy->options().kernel_size, conv.options().kernel_size);
}

TEST(Conv2dLayerTest, Errors) {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { Conv2d(Conv2dOptions{3, 4, {3, 3}, {1, 1}, {0, 0}, {1, 1}, 2}); })
                .find("Conv2d(3, 4): groups=2 must divide both channel counts"),
            std::string::npos);
  EXPECT_NE(message([] { Conv2d(3, 4, 0); }).find("kernel_size (0, 0)"), std::string::npos);
  Conv2d conv(3, 4, 3);
  EXPECT_NE(message([&] { conv.forward(zeros({2, 4, 8, 8})); })
                .find("Conv2d(3, 4): expected input (N, C_in=3, H, W), got [2, 4, 8, 8]"),
            std::string::npos);
  EXPECT_NE(message([] { MaxPool2d(2, 2, 2); }).find("MaxPool2d: padding (2, 2)"), std::string::npos);
  EXPECT_NE(message([] { AdaptiveAvgPool2d({0, 1}); }).find("AdaptiveAvgPool2d: output_size (0, 1)"),
            std::string::npos);
}

TEST(Conv2dLayerTest, Gradcheck) {
  Conv2d conv(Conv2dOptions{4, 6, {3, 2}, {2, 1}, {1, 1}, {1, 2}, 2, true, TensorOptions(DType::Float64)});
  Tensor x = testing::randn_leaf({2, 4, 7, 6}, 7);
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return conv.forward(in[0]); },
                               {x, conv.weight, conv.bias}),
            "");
}

TEST(PoolingLayerTest, ShapesAndDefaults) {
  Tensor x = zeros({2, 3, 8, 7});
  EXPECT_EQ(MaxPool2d(2).forward(x).shape(), (Shape{2, 3, 4, 3}));  // stride defaults to the kernel
  EXPECT_EQ(MaxPool2d(3, 1, 1).forward(x).shape(), (Shape{2, 3, 8, 7}));
  EXPECT_EQ(AvgPool2d(3, 2).forward(x).shape(), (Shape{2, 3, 3, 3}));
  EXPECT_EQ(AdaptiveAvgPool2d({1, 1}).forward(x).shape(), (Shape{2, 3, 1, 1}));
  EXPECT_TRUE(MaxPool2d(2).parameters().empty());
}

TEST(PoolingLayerTest, Gradcheck) {
  Tensor x = testing::randn_leaf({2, 2, 6, 7}, 9);  // continuous values: no max ties
  auto check = [&](Module& m) {
    return testing::gradcheck([&](const std::vector<Tensor>& in) { return m.forward(in[0]); }, {x});
  };
  MaxPool2d max_pool({3, 2}, {2, 2}, {1, 1});
  AvgPool2d avg_pool({3, 2}, {2, 1}, {1, 1});
  AdaptiveAvgPool2d adaptive({4, 5});
  EXPECT_EQ(check(max_pool), "");
  EXPECT_EQ(check(avg_pool), "");
  EXPECT_EQ(check(adaptive), "");
}

// ---------------------------------------------------------------------------------------------------------
// PyTorch golden values (tests/golden/gen_conv.py). float64 on both sides: only summation order differs,
// 1e-10 relative per element. float32: 1e-5 relative to the tensor's largest |value| (max_relative_error
// with that as its floor), because an element near 0 keeps the absolute rounding error of its sum: dweight
// sums 32 products of O(1) values, ~2e-6 absolute even between PyTorch's own float32 and float64.

double tolerance(const Tensor& expected) { return expected.dtype() == DType::Float64 ? 1e-10 : 1e-5; }
double floor_of(const Tensor& expected) {
  if (expected.dtype() == DType::Float64) return 1e-6;
  return std::sqrt(max(square(expected.to(DType::Float64))).item());  // max |expected|
}

void expect_close(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  EXPECT_LT(testing::max_relative_error(actual, expected, floor_of(expected)), tolerance(expected)) << what;
}

struct ConvCase {
  std::string name;
  Conv2dOptions options;
};

TEST(Conv2dLayerTest, MatchesPyTorch) {
  testing::Golden g = testing::load_golden("conv");
  const TensorOptions f64(DType::Float64), f32(DType::Float32);
  const ConvCase cases[] = {
      {"plain", {3, 4, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true, f64}},
      {"grouped", {4, 6, {3, 2}, {2, 1}, {1, 0}, {2, 1}, 2, true, f64}},
      {"depthwise", {3, 3, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 3, false, f64}},
      {"strided32", {3, 8, {3, 3}, {2, 2}, {1, 1}, {1, 1}, 1, true, f32}},
  };
  for (const ConvCase& c : cases) {
    SCOPED_TRACE(c.name);
    Conv2d conv(c.options);
    {
      NoGradGuard no_grad;
      conv.weight.copy_(g.tensor(c.name + "_weight"));
      if (c.options.bias) conv.bias.copy_(g.tensor(c.name + "_bias"));
    }
    Tensor x = g.tensor(c.name + "_x").clone().set_requires_grad(true);
    Tensor y = conv.forward(x);
    y.backward(g.tensor(c.name + "_dy"));
    expect_close(y, g.tensor(c.name + "_y"), "y");
    expect_close(x.grad(), g.tensor(c.name + "_dx"), "dx");
    expect_close(conv.weight.grad(), g.tensor(c.name + "_dweight"), "dweight");
    if (c.options.bias) expect_close(conv.bias.grad(), g.tensor(c.name + "_dbias"), "dbias");
  }
}

TEST(PoolingLayerTest, MatchesPyTorch) {
  testing::Golden g = testing::load_golden("conv");
  struct PoolCase {
    std::string name;
    std::shared_ptr<Module> module;
  };
  const PoolCase cases[] = {
      {"maxpool", std::make_shared<MaxPool2d>(3, 2, 1)},
      {"maxpool_rect", std::make_shared<MaxPool2d>(std::array<int64_t, 2>{2, 3}, std::array<int64_t, 2>{1, 2},
                                                   std::array<int64_t, 2>{1, 1})},
      {"avgpool", std::make_shared<AvgPool2d>(3, 2, 1)},
      {"avgpool_rect", std::make_shared<AvgPool2d>(std::array<int64_t, 2>{2, 3}, std::array<int64_t, 2>{1, 2},
                                                   std::array<int64_t, 2>{1, 1})},
      {"adaptive", std::make_shared<AdaptiveAvgPool2d>(std::array<int64_t, 2>{3, 4})},
      {"adaptive_up", std::make_shared<AdaptiveAvgPool2d>(std::array<int64_t, 2>{4, 7})},
      {"maxpool32", std::make_shared<MaxPool2d>(2)},
      {"avgpool32", std::make_shared<AvgPool2d>(3, 1, 1)},
      {"adaptive32", std::make_shared<AdaptiveAvgPool2d>(std::array<int64_t, 2>{1, 1})},
  };
  for (const PoolCase& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor x = g.tensor(c.name + "_x").clone().set_requires_grad(true);
    Tensor y = c.module->forward(x);
    y.backward(g.tensor(c.name + "_dy"));
    expect_close(y, g.tensor(c.name + "_y"), "y");
    expect_close(x.grad(), g.tensor(c.name + "_dx"), "dx");
  }
}

}  // namespace
}  // namespace dpe::nn
