// conv2d and the pooling ops: hand-checked values, float32 (oneDNN) against float64 (im2col + GEMM),
// numerical gradient checks, input errors, and CUDA against CPU (skipped without a GPU).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/amp/autocast.h"
#include "core/backends.h"
#include "core/error.h"
#include "core/kernels/conv.h"
#include "core/kernels/pool.h"
#include "core/ops.h"
#include "core/ops/conv.h"
#include "core/ops/pool.h"
#include "tests/testing/gradcheck.h"

namespace dpe {
namespace {

using testing::gradcheck;
using testing::randn_leaf;

Tensor f64(std::vector<double> v, const Shape& shape) { return Tensor::from_vector(v, shape); }
Tensor arange_f64(const Shape& shape) { return arange(shape_numel(shape), DType::Float64).reshape(shape); }

// Expects `f` to throw dpe::Error whose message contains `part`.
template <typename F>
void expect_error(F&& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing: " << part;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

struct ConvConfig {
  int64_t n, c_in, h, w, c_out, kh, kw;
  std::array<int64_t, 2> stride, padding, dilation;
  int64_t groups;
  bool bias;
};

// Small configurations covering stride, padding, dilation, groups (incl. depthwise), non-square kernels
// and bias on/off.
const ConvConfig kConfigs[] = {
    {2, 3, 5, 6, 4, 3, 3, {1, 1}, {0, 0}, {1, 1}, 1, true},
    {1, 2, 7, 5, 3, 3, 2, {2, 1}, {1, 0}, {1, 1}, 1, false},
    {2, 4, 6, 6, 6, 3, 3, {1, 2}, {2, 1}, {2, 1}, 2, true},
    {1, 3, 5, 5, 3, 3, 3, {1, 1}, {1, 1}, {1, 1}, 3, true},   // depthwise
    {2, 4, 4, 5, 2, 1, 1, {1, 1}, {0, 0}, {1, 1}, 2, false},  // 1x1, grouped
    {1, 2, 8, 7, 4, 2, 3, {3, 2}, {1, 1}, {2, 2}, 1, true},
};

std::string describe(const ConvConfig& c) {
  return detail::str_cat("x (", c.n, ", ", c.c_in, ", ", c.h, ", ", c.w, ") C_out ", c.c_out, " k (", c.kh, ", ",
                         c.kw, ") stride (", c.stride[0], ", ", c.stride[1], ") pad (", c.padding[0], ", ",
                         c.padding[1], ") dil (", c.dilation[0], ", ", c.dilation[1], ") groups ", c.groups,
                         c.bias ? " bias" : " no bias");
}

// ---------------------------------------------------------------------------------------------------------
// conv2d values

TEST(Conv2dTest, HandCheckedValues) {
  // x = 1..9 as 3x3, a 2x2 kernel of ones: each output sums a 2x2 block.
  Tensor x = add(arange_f64({1, 1, 3, 3}), 1.0);
  Tensor w = ones({1, 1, 2, 2}, DType::Float64);
  EXPECT_EQ(conv2d(x, w).to_vector<double>(), (std::vector<double>{12, 16, 24, 28}));
  EXPECT_EQ(conv2d(x, w, f64({10}, {1})).to_vector<double>(), (std::vector<double>{22, 26, 34, 38}));
  // 3x3 ones, padding 1, stride 2: the corners' 2x2 blocks.
  Tensor y = conv2d(x, ones({1, 1, 3, 3}, DType::Float64), {}, {2, 2}, {1, 1});
  EXPECT_EQ(y.shape(), (Shape{1, 1, 2, 2}));
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{12, 16, 24, 28}));
  // Dilation 2 on 3x3 with a 2x2 kernel: the four corners 1 + 3 + 7 + 9.
  EXPECT_EQ(conv2d(x, w, {}, {1, 1}, {0, 0}, {2, 2}).to_vector<double>(), (std::vector<double>{20}));
  // Cross-correlation, not convolution: a kernel [[1, 0], [0, 0]] picks the top-left element.
  Tensor pick = f64({1, 0, 0, 0}, {1, 1, 2, 2});
  EXPECT_EQ(conv2d(x, pick).to_vector<double>(), (std::vector<double>{1, 2, 4, 5}));
  // Unbatched input gives an unbatched output.
  EXPECT_EQ(conv2d(x.reshape({1, 3, 3}), w).shape(), (Shape{1, 2, 2}));
}

TEST(Conv2dTest, GroupsAreIndependentConvolutions) {
  Tensor x = randn_leaf({2, 4, 5, 5}, 3), w = randn_leaf({6, 2, 3, 3}, 4), b = randn_leaf({6}, 5);
  Tensor y = conv2d(x, w, b, {1, 1}, {1, 1}, {1, 1}, 2);
  Tensor y0 = conv2d(x.narrow(1, 0, 2), w.narrow(0, 0, 3), b.narrow(0, 0, 3), {1, 1}, {1, 1});
  Tensor y1 = conv2d(x.narrow(1, 2, 2), w.narrow(0, 3, 3), b.narrow(0, 3, 3), {1, 1}, {1, 1});
  EXPECT_LT(max_abs_diff(y, cat({y0, y1}, 1)), 1e-12);
}

// float32 runs on oneDNN, float64 on im2col + GEMM: the two must agree (forward and both gradients).
TEST(Conv2dTest, Float32OneDnnMatchesFloat64Im2col) {
  for (const ConvConfig& c : kConfigs) {
    SCOPED_TRACE(describe(c));
    Tensor x = randn_leaf({c.n, c.c_in, c.h, c.w}, 11), w = randn_leaf({c.c_out, c.c_in / c.groups, c.kh, c.kw}, 12);
    Tensor b = c.bias ? randn_leaf({c.c_out}, 13) : Tensor();
    Tensor x32 = x.detach().to(DType::Float32).set_requires_grad(true);
    Tensor w32 = w.detach().to(DType::Float32).set_requires_grad(true);
    Tensor b32 = c.bias ? b.detach().to(DType::Float32).set_requires_grad(true) : Tensor();
    Tensor y = conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups);
    Tensor y32 = conv2d(x32, w32, b32, c.stride, c.padding, c.dilation, c.groups);
    ASSERT_EQ(y.shape(), y32.shape());
    Tensor dy = randn_leaf(y.shape(), 14).detach();
    y.backward(dy);
    y32.backward(dy.to(DType::Float32));
    // float32 products summed over K <= 36 terms of N(0,1) values: errors ~1e-6 absolute.
    EXPECT_LT(max_abs_diff(y32.to(DType::Float64), y), 1e-4);
    EXPECT_LT(max_abs_diff(x32.grad().to(DType::Float64), x.grad()), 1e-4);
    EXPECT_LT(max_abs_diff(w32.grad().to(DType::Float64), w.grad()), 1e-4);
    if (c.bias) {
      EXPECT_LT(max_abs_diff(b32.grad().to(DType::Float64), b.grad()), 1e-4);
    }
  }
}

TEST(Conv2dTest, EmptyBatch) {
  Tensor x = zeros({0, 2, 4, 4}), w = ones({3, 2, 3, 3}).set_requires_grad(true);
  Tensor b = ones({3}).set_requires_grad(true);
  Tensor y = conv2d(x, w, b);
  EXPECT_EQ(y.shape(), (Shape{0, 3, 2, 2}));
  sum(y).backward();
  EXPECT_EQ(w.grad().to_vector<float>(), std::vector<float>(54, 0.0f));
  EXPECT_EQ(b.grad().to_vector<float>(), std::vector<float>(3, 0.0f));
}

TEST(Conv2dTest, Gradcheck) {
  for (const ConvConfig& c : kConfigs) {
    SCOPED_TRACE(describe(c));
    Tensor x = randn_leaf({c.n, c.c_in, c.h, c.w}, 21), w = randn_leaf({c.c_out, c.c_in / c.groups, c.kh, c.kw}, 22);
    std::vector<Tensor> inputs = {x, w};
    if (c.bias) inputs.push_back(randn_leaf({c.c_out}, 23));
    EXPECT_EQ(gradcheck(
                  [&](const std::vector<Tensor>& in) {
                    return conv2d(in[0], in[1], in.size() > 2 ? in[2] : Tensor(), c.stride, c.padding, c.dilation,
                                  c.groups);
                  },
                  inputs),
              "");
  }
}

TEST(Conv2dTest, GradcheckInputOnly) {
  // Only x requires grad: the weight is not saved for a gradient nobody asks for, and vice versa.
  Tensor x = randn_leaf({1, 2, 4, 4}, 31);
  Tensor w = randn_leaf({2, 2, 3, 3}, 32).detach();
  EXPECT_EQ(gradcheck([&](const std::vector<Tensor>& in) { return conv2d(in[0], w, {}, {1, 1}, {1, 1}); }, {x}), "");
  Tensor x2 = randn_leaf({1, 2, 4, 4}, 33).detach();
  Tensor w2 = randn_leaf({2, 2, 3, 3}, 34);
  EXPECT_EQ(gradcheck([&](const std::vector<Tensor>& in) { return conv2d(x2, in[0], {}, {2, 1}); }, {w2}), "");
  // Only the bias: its gradient comes from a reduction of dy, without the weight-gradient kernel.
  Tensor b = randn_leaf({2}, 35);
  EXPECT_EQ(gradcheck([&](const std::vector<Tensor>& in) { return conv2d(x2, w2.detach(), in[0]); }, {b}), "");
}

TEST(Conv2dTest, Errors) {
  Tensor x = zeros({2, 4, 8, 8}), w = zeros({5, 3, 3, 3});
  expect_error([&] { conv2d(x, w); }, "conv2d: expected input (N, C_in=3, H, W), got [2, 4, 8, 8]");
  expect_error([&] { conv2d(zeros({4, 8, 8, 1, 1}), w); },
               "conv2d: expected input (N, C_in=3, H, W), got [4, 8, 8, 1, 1]");
  expect_error([&] { conv2d(zeros({4, 8, 8}), w); }, "conv2d: expected input (C_in=3, H, W), got [4, 8, 8]");
  expect_error([&] { conv2d(x, zeros({5, 3, 3})); },
               "conv2d: expected weight (C_out, C_in/groups, kH, kW), got [5, 3, 3]");
  expect_error([&] { conv2d(x, zeros({5, 2, 3, 3}), {}, {1, 1}, {0, 0}, {1, 1}, 2); },
               "conv2d: C_out=5 (weight [5, 2, 3, 3]) is not divisible by groups=2");
  expect_error([&] { conv2d(x, zeros({6, 2, 3, 3}), {}, {1, 1}, {0, 0}, {1, 1}, 3); },
               "conv2d: expected input (N, C_in=6, H, W), got [2, 4, 8, 8]");
  expect_error([&] { conv2d(zeros({2, 3, 8, 8}), w, zeros({4})); }, "conv2d: expected bias (C_out=5), got [4]");
  expect_error([&] { conv2d(zeros({2, 3, 2, 2}), w); },
               "conv2d: input [2, 3, 2, 2] padded by (0, 0) is smaller than the dilated kernel (3, 3)");
  expect_error([&] { conv2d(zeros({2, 3, 8, 8}), w, {}, {0, 1}); }, "conv2d: stride must be positive, got (0, 1)");
  expect_error([&] { conv2d(zeros({2, 3, 8, 8}), w, {}, {1, 1}, {-1, 0}); }, "conv2d: padding must be non-negative");
  expect_error([&] { conv2d(zeros({2, 3, 8, 8}), w, {}, {1, 1}, {0, 0}, {1, 0}); },
               "conv2d: dilation must be positive");
  expect_error([&] { conv2d(zeros({2, 3, 8, 8}), zeros({5, 3, 3, 3}, DType::Float64)); }, "conv2d: dtypes differ");
  expect_error([&] { conv2d(zeros({2, 3, 8, 8}, DType::Int64), zeros({5, 3, 3, 3}, DType::Int64)); },
               "conv2d: expected a float32 or float64 tensor");
  expect_error([&] { conv2d(zeros({2, 3, 8, 8}), w.to(Device::cpu(1))); },
               "conv2d: tensors are on different devices");
}

// ---------------------------------------------------------------------------------------------------------
// pooling values

TEST(PoolTest, MaxPoolValuesAndIndices) {
  Tensor x = arange_f64({1, 1, 4, 4});
  ValuesIndices r = max_pool2d_with_indices(x, {2, 2}, {2, 2});
  EXPECT_EQ(r.values.to_vector<double>(), (std::vector<double>{5, 7, 13, 15}));
  EXPECT_EQ(r.indices.to_vector<int64_t>(), (std::vector<int64_t>{5, 7, 13, 15}));
  // Padding is -inf: with all-negative inputs the padded border never wins.
  Tensor neg_x = add(neg(x), -1.0);  // -1 .. -16
  Tensor y = max_pool2d(neg_x, {3, 3}, {2, 2}, {1, 1});
  EXPECT_EQ(y.shape(), (Shape{1, 1, 2, 2}));
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{-1, -2, -5, -6}));
  // The gradient goes to each window's maximum, summed where windows share it (stride 1).
  Tensor xl = f64({1, 9, 2, 3, 4, 5, 6, 7, 8}, {1, 1, 3, 3}).set_requires_grad(true);
  sum(max_pool2d(xl, {2, 2}, {1, 1})).backward();
  EXPECT_EQ(xl.grad().to_vector<double>(), (std::vector<double>{0, 2, 0, 0, 0, 0, 0, 1, 1}));
  // Default stride is the kernel size; unbatched input stays unbatched.
  EXPECT_EQ(max_pool2d(zeros({3, 6, 6}), {2, 3}).shape(), (Shape{3, 3, 2}));
}

// PyTorch's rules: the first maximum in window order wins a tie, and the first NaN wins outright.
TEST(PoolTest, MaxPoolTiesAndNaNLikePyTorch) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = f64({1, 3, 3, nan, 3, 2, nan, 5}, {1, 1, 2, 4});
  ValuesIndices r = max_pool2d_with_indices(x, {2, 2}, {2, 2});  // windows {0, 1, 4, 5} and {2, 3, 6, 7}
  EXPECT_EQ(r.indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(r.values.to_vector<double>()[0], 3);
  EXPECT_TRUE(std::isnan(r.values.to_vector<double>()[1]));
  r = max_pool2d_with_indices(x, {2, 2}, {1, 1});  // overlapping windows
  EXPECT_EQ(r.indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 6, 3}));
}

// Unpadded pools take their own search (no clipping, selects instead of branches); a padded pool's interior
// outputs see the same windows through the general search: both must pick the same values and indices, ties
// and NaNs included.
TEST(PoolTest, MaxPoolUnpaddedSearchMatchesTheGeneralOne) {
  std::mt19937 gen(4);
  std::uniform_int_distribution<int> small(-3, 3);  // few distinct values: many ties
  std::vector<double> values(2 * 3 * 9 * 11);
  for (double& v : values) v = small(gen);
  Tensor x = f64(values, {2, 3, 9, 11});
  x.select(3, 4).select(2, 6).fill_(std::numeric_limits<double>::quiet_NaN());
  ValuesIndices unpadded = max_pool2d_with_indices(x, {3, 3}, {1, 1});
  ValuesIndices padded = max_pool2d_with_indices(x, {3, 3}, {1, 1}, {1, 1});
  auto interior = [](const Tensor& t) { return t.narrow(2, 1, 7).narrow(3, 1, 9).contiguous(); };
  EXPECT_EQ(unpadded.indices.to_vector<int64_t>(), interior(padded.indices).to_vector<int64_t>());
  std::vector<double> a = unpadded.values.to_vector<double>(), b = interior(padded.values).to_vector<double>();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i]))) << i;
}

// float32 MaxPool2d(2) runs its own vector kernel (Note [2x2 max-pool]); float64 the general unpadded search.
// Widths 2..41 cover full vectors, masked tails and rows shorter than a vector, odd sizes a dropped last row
// and column; values with many ties, both zeros, infinities and NaNs: the same values (sign of zero included)
// and indices.
TEST(PoolTest, MaxPool2x2FloatKernelMatchesTheGeneralSearch) {
  std::mt19937 gen(7);
  const double specials[] = {0.0, -0.0, std::numeric_limits<double>::infinity(),
                             -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()};
  std::uniform_int_distribution<int> pick(-3, 6);  // -3..1: small integers (ties), 2..6: a special value
  for (int64_t w = 2; w <= 41; ++w) {
    const int64_t h = w % 3 + 2;
    std::vector<double> values(static_cast<size_t>(3 * h * w));
    for (double& v : values) {
      const int k = pick(gen);
      v = k <= 1 ? k : specials[k - 2];
    }
    SCOPED_TRACE(detail::str_cat("input (3, ", h, ", ", w, ")"));
    Tensor x = f64(values, {1, 3, h, w});
    ValuesIndices general = max_pool2d_with_indices(x, {2, 2}, {2, 2});
    ValuesIndices vector = max_pool2d_with_indices(x.to(DType::Float32), {2, 2}, {2, 2});
    EXPECT_EQ(vector.indices.to_vector<int64_t>(), general.indices.to_vector<int64_t>());
    std::vector<double> a = vector.values.to(DType::Float64).to_vector<double>();
    std::vector<double> b = general.values.to_vector<double>();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE((a[i] == b[i] && std::signbit(a[i]) == std::signbit(b[i])) || (std::isnan(a[i]) && std::isnan(b[i])))
          << i << ": " << a[i] << " against " << b[i];
    }
  }
}

// Windows that do not overlap take max_pool2d_backward_cpu's scatter instead of its gather: dx must be dy at
// the winners and zeros elsewhere (rows and columns no window covers included), with ties and NaN winners,
// float32 and float64.
TEST(PoolTest, MaxPoolBackwardOfTilingWindowsScattersDyToTheWinners) {
  std::mt19937 gen(9);
  std::uniform_int_distribution<int> small(-2, 2);  // ties
  struct Case {
    int64_t h, w, kh, kw;
  };
  for (const Case& c : {Case{4, 4, 2, 2}, Case{7, 9, 2, 2}, Case{6, 7, 3, 2}, Case{5, 8, 2, 3}, Case{3, 3, 3, 3},
                        Case{9, 5, 1, 2}}) {
    for (DType dtype : {DType::Float32, DType::Float64}) {
      SCOPED_TRACE(detail::str_cat("input ", c.h, "x", c.w, " kernel ", c.kh, "x", c.kw, " ", dtype));
      std::vector<double> values(static_cast<size_t>(2 * 3 * c.h * c.w));
      for (double& v : values) v = small(gen);
      values[5] = std::numeric_limits<double>::quiet_NaN();
      Tensor x = f64(values, {2, 3, c.h, c.w}).to(dtype).set_requires_grad(true);
      ValuesIndices r = max_pool2d_with_indices(x, {c.kh, c.kw}, {c.kh, c.kw});
      Tensor dy = randn(r.values.shape(), dtype);
      r.values.backward(dy);
      const int64_t plane = c.h * c.w, out_plane = r.values.size(2) * r.values.size(3);
      std::vector<double> want(values.size(), 0.0);
      const std::vector<int64_t> idx = r.indices.to_vector<int64_t>();
      const std::vector<double> g = dy.to(DType::Float64).to_vector<double>();
      for (size_t o = 0; o < idx.size(); ++o) want[static_cast<size_t>(o / out_plane * plane + idx[o])] = g[o];
      EXPECT_EQ(x.grad().to(DType::Float64).to_vector<double>(), want);
    }
  }
}

// max_pool2d of a float32 MaxPool2d(2) on CPU saves window codes, not indices (Note [Window codes]); its
// values and gradient must be max_pool2d_with_indices's bit for bit: widths 2..41 (full vectors, masked tails,
// rows shorter than a vector, odd widths with a column no window covers), odd and even heights, ties, both
// zeros, infinities and NaNs in x, and a NaN and a -0 in dy (moved as they are, not multiplied).
TEST(PoolTest, MaxPool2x2WindowCodesGiveTheIndicesGradientBitForBit) {
  std::mt19937 gen(11);
  const float specials[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
  std::uniform_int_distribution<int> pick(-3, 6);  // -3..1: small integers (ties), 2..6: a special value
  auto bits = [](const Tensor& t) {
    std::vector<float> v = t.to_vector<float>();
    std::vector<uint32_t> b(v.size());
    std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
    return b;
  };
  for (int64_t w = 2; w <= 41; ++w) {
    const int64_t h = w % 4 + 2;
    SCOPED_TRACE(detail::str_cat("input (2, 3, ", h, ", ", w, ")"));
    std::vector<float> values(static_cast<size_t>(2 * 3 * h * w));
    for (float& v : values) {
      const int k = pick(gen);
      v = k <= 1 ? static_cast<float>(k) : specials[k - 2];
    }
    kernels::Pool2dShape s{.planes = 6, .h = h, .w = w, .h_out = h / 2, .w_out = w / 2, .kh = 2, .kw = 2,
                           .stride_h = 2, .stride_w = 2};
    ASSERT_TRUE(kernels::max_pool2d_2x2_applies(s));  // else this test would not reach the codes
    Tensor x_codes = Tensor::from_vector(values, {2, 3, h, w}).set_requires_grad(true);
    Tensor x_indices = Tensor::from_vector(values, {2, 3, h, w}).set_requires_grad(true);
    Tensor y = max_pool2d(x_codes, {2, 2});
    ValuesIndices r = max_pool2d_with_indices(x_indices, {2, 2}, {2, 2});
    EXPECT_EQ(bits(y), bits(r.values));
    Tensor dy = randn(y.shape(), DType::Float32);
    dy.view({-1}).select(0, 0).fill_(std::numeric_limits<float>::quiet_NaN());
    dy.view({-1}).select(0, dy.numel() - 1).fill_(-0.0);
    y.backward(dy);
    r.values.backward(dy);
    EXPECT_EQ(bits(x_codes.grad()), bits(x_indices.grad()));
  }
}

// max_pool2d_relu is relu(max_pool2d) in one pass (the window-code kernels) or as the two ops (any other pool):
// values and gradients bit for bit, NCHW and channels last, with negative windows, both zeros, NaNs and ties.
TEST(PoolTest, MaxPool2dReluIsReluOfMaxPoolBitForBit) {
  std::mt19937 gen(13);
  const float specials[] = {0.0f, -0.0f, std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::infinity()};
  std::uniform_int_distribution<int> pick(-4, 5);  // -4..1: small integers, mostly <= 0; 2..5: a special value
  auto bits = [](const Tensor& t) {
    std::vector<float> v = t.to_vector<float>();
    std::vector<uint32_t> b(v.size());
    std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
    return b;
  };
  struct Case {
    int64_t c, h, w, k;
    MemoryFormat format;
  };
  for (const Case& c : {Case{3, 6, 10, 2, MemoryFormat::Contiguous}, Case{5, 7, 9, 2, MemoryFormat::Contiguous},
                        Case{13, 6, 6, 2, MemoryFormat::ChannelsLast}, Case{3, 7, 9, 2, MemoryFormat::ChannelsLast},
                        Case{3, 7, 9, 3, MemoryFormat::Contiguous}}) {
    SCOPED_TRACE(detail::str_cat("C ", c.c, ", ", c.h, "x", c.w, ", kernel ", c.k,
                                 c.format == MemoryFormat::ChannelsLast ? ", channels last" : ""));
    std::vector<float> values(static_cast<size_t>(2 * c.c * c.h * c.w));
    for (float& v : values) {
      const int k = pick(gen);
      v = k <= 1 ? static_cast<float>(k) : specials[k - 2];
    }
    Tensor fused_x = Tensor::from_vector(values, {2, c.c, c.h, c.w}).set_requires_grad(true);
    Tensor apart_x = Tensor::from_vector(values, {2, c.c, c.h, c.w}).set_requires_grad(true);
    Tensor fused = max_pool2d_relu(fused_x.contiguous(c.format), {c.k, c.k}, {c.k, c.k});
    Tensor apart = relu(max_pool2d(apart_x.contiguous(c.format), {c.k, c.k}, {c.k, c.k}));
    EXPECT_EQ(bits(fused), bits(apart));
    Tensor dy = randn(fused.shape());
    dy.view({-1}).select(0, 1).fill_(std::numeric_limits<float>::quiet_NaN());
    fused.backward(dy);
    apart.backward(dy);
    EXPECT_EQ(bits(fused_x.grad()), bits(apart_x.grad()));
  }
}

TEST(PoolTest, AvgPoolCountsPadding) {
  // 2x2 ones, kernel 2, stride 1, padding 1: corners see one element of four, edges two, the centre four.
  Tensor x = ones({1, 1, 2, 2}, DType::Float64);
  Tensor y = avg_pool2d(x, {2, 2}, {1, 1}, {1, 1});
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{0.25, 0.5, 0.25, 0.5, 1, 0.5, 0.25, 0.5, 0.25}));
  EXPECT_EQ(avg_pool2d(arange_f64({1, 1, 4, 4}), {2, 2}).to_vector<double>(),
            (std::vector<double>{2.5, 4.5, 10.5, 12.5}));
  // Backward spreads dy / divisor over each window.
  Tensor xl = ones({1, 1, 2, 2}, DType::Float64).set_requires_grad(true);
  sum(avg_pool2d(xl, {2, 2}, {1, 1}, {1, 1})).backward();
  EXPECT_EQ(xl.grad().to_vector<double>(), (std::vector<double>{1, 1, 1, 1}));  // 4 windows * 1/4 each
}

TEST(PoolTest, AdaptiveAvgPoolWindows) {
  // 5 -> 2: rows [0, 3) and [2, 5) (overlapping), likewise columns.
  Tensor y = adaptive_avg_pool2d(arange_f64({1, 1, 5, 5}), {2, 2});
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{6, 8, 16, 18}));
  // Global pooling.
  EXPECT_EQ(adaptive_avg_pool2d(arange_f64({2, 3, 4}), {1, 1}).to_vector<double>(), (std::vector<double>{5.5, 17.5}));
  // Upsampling (output larger than input) repeats elements.
  EXPECT_EQ(adaptive_avg_pool2d(arange_f64({1, 1, 2}), {2, 4}).to_vector<double>(),
            (std::vector<double>{0, 0, 1, 1, 0, 0, 1, 1}));
}

TEST(PoolTest, Gradcheck) {
  // N(0,1) values: ties inside a max window have probability 0.
  Tensor x = randn_leaf({2, 3, 7, 6}, 41);
  const std::array<int64_t, 2> k33{3, 3}, k23{2, 3}, s21{2, 1}, s11{1, 1}, p11{1, 1}, p01{0, 1};
  EXPECT_EQ(gradcheck([&](const std::vector<Tensor>& in) { return max_pool2d(in[0], k33, s21, p11); }, {x}), "");
  EXPECT_EQ(gradcheck([&](const std::vector<Tensor>& in) { return max_pool2d(in[0], k23, s11, p01); }, {x}), "");
  EXPECT_EQ(gradcheck([&](const std::vector<Tensor>& in) { return max_pool2d(in[0], {2, 2}); }, {x}), "");
  EXPECT_EQ(gradcheck([&](const std::vector<Tensor>& in) { return avg_pool2d(in[0], k33, s21, p11); }, {x}), "");
  EXPECT_EQ(gradcheck([&](const std::vector<Tensor>& in) { return avg_pool2d(in[0], k23, s11, p01); }, {x}), "");
  for (std::array<int64_t, 2> out : {std::array<int64_t, 2>{3, 4}, {1, 1}, {7, 6}, {4, 5}, {9, 8}}) {
    SCOPED_TRACE(detail::str_cat("adaptive output (", out[0], ", ", out[1], ")"));
    EXPECT_EQ(gradcheck([&](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], out); }, {x}), "");
  }
}

TEST(PoolTest, Errors) {
  Tensor x = zeros({2, 3, 8, 8});
  expect_error([&] { max_pool2d(zeros({8, 8}), {2, 2}); },
               "max_pool2d: expected input (N, C, H, W) or (C, H, W) with H, W > 0, got [8, 8]");
  expect_error([&] { max_pool2d(x, {2, 2}, {2, 2}, {2, 0}); },
               "max_pool2d: padding (2, 0) must be >= 0 and at most half the kernel size (2, 2)");
  expect_error([&] { avg_pool2d(x, {0, 2}); }, "avg_pool2d: kernel size must be positive, got (0, 2)");
  expect_error([&] { avg_pool2d(x, {2, 2}, {0, 1}); }, "avg_pool2d: stride must be positive, got (0, 1)");
  expect_error([&] { max_pool2d(zeros({1, 1, 2, 2}), {3, 3}); },
               "max_pool2d: input [1, 1, 2, 2] padded by (0, 0) is smaller than the kernel (3, 3)");
  expect_error([&] { adaptive_avg_pool2d(x, {0, 2}); },
               "adaptive_avg_pool2d: output_size must be positive, got (0, 2)");
  expect_error([&] { adaptive_avg_pool2d(zeros({2, 3, 0, 4}), {1, 1}); }, "adaptive_avg_pool2d: expected input");
  expect_error([&] { avg_pool2d(zeros({1, 1, 4, 4}, DType::Int64), {2, 2}); },
               "avg_pool2d: expected a float32 or float64 tensor");
}

// ---------------------------------------------------------------------------------------------------------
// CUDA against CPU (cuDNN convolution, pooling kernels).

// Runs f on cpu:0 and on `device` with fresh leaves holding the inputs' values, backward with the same dy, and
// compares outputs and input gradients within tol. Fresh leaves on both sides: reusing the caller's tensors
// would accumulate their gradients across calls (PoolsMatchCpu once failed so on a GPU).
void expect_device_matches_cpu(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                               const std::vector<Tensor>& inputs, double tol, Device device = Device::cuda(0)) {
  std::vector<Tensor> cpu_inputs, device_inputs;
  for (const Tensor& t : inputs) {
    cpu_inputs.push_back(t.detach().clone().set_requires_grad(true));
    device_inputs.push_back(t.detach().to(device).clone().set_requires_grad(true));
  }
  Tensor y_cpu = f(cpu_inputs), y_device = f(device_inputs);
  ASSERT_EQ(y_cpu.shape(), y_device.shape());
  Tensor dy = randn(y_cpu.shape(), y_cpu.dtype());
  y_cpu.backward(dy);
  y_device.backward(dy.to(device));
  EXPECT_LT(max_abs_diff(y_device.to(Device::cpu(0)), y_cpu), tol);
  for (size_t i = 0; i < inputs.size(); ++i) {
    SCOPED_TRACE(detail::str_cat("input ", i));
    EXPECT_LT(max_abs_diff(device_inputs[i].grad().to(Device::cpu(0)), cpu_inputs[i].grad()), tol);
  }
}

std::vector<Tensor> leaves(std::vector<Tensor> ts, DType dtype) {
  for (Tensor& t : ts) t = t.detach().to(dtype).set_requires_grad(true);
  return ts;
}

// f32_tol: see the comment at the call below.
void expect_conv2d_matches_cpu(double f32_tol) {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (const ConvConfig& c : kConfigs) {
      SCOPED_TRACE(describe(c) + (dtype == DType::Float32 ? " float32" : " float64"));
      std::vector<Tensor> in = leaves({randn_leaf({c.n, c.c_in, c.h, c.w}, 51),
                                       randn_leaf({c.c_out, c.c_in / c.groups, c.kh, c.kw}, 52)},
                                      dtype);
      if (c.bias) in.push_back(leaves({randn_leaf({c.c_out}, 53)}, dtype)[0]);
      expect_device_matches_cpu(
          [&](const std::vector<Tensor>& t) {
            return conv2d(t[0], t[1], t.size() > 2 ? t[2] : Tensor(), c.stride, c.padding, c.dilation, c.groups);
          },
          in, dtype == DType::Float32 ? f32_tol : 1e-12);
    }
  }
}

TEST(ConvCudaTest, Conv2dMatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  // float32: cuDNN's deterministic algorithms (FMA math, no TF32) and oneDNN sum <= 36 products in different
  // orders: ~1e-6 absolute on N(0,1) data; the batch sum of dw adds a few more terms. float64: ~1e-15.
  expect_conv2d_matches_cpu(1e-4);
}

// Turns backends::cudnn::benchmark on for a scope.
struct CudnnBenchmarkOn {
  CudnnBenchmarkOn() { backends::cudnn::set_benchmark(true); }
  ~CudnnBenchmarkOn() { backends::cudnn::set_benchmark(false); }
};

// The measured algorithms (cudnnFind*AlgorithmEx) compute the same convolutions, Find's trial runs leave the
// caller's outputs alone, and turning benchmark off again brings back the heuristics' algorithms, bit for bit.
TEST(ConvCudaTest, MeasuredAlgorithmsMatchCpuAndOffRestoresTheHeuristicChoice) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  const Tensor x = randn_leaf({16, 8, 20, 20}, 61).detach().to(DType::Float32).to(gpu);
  const Tensor w = randn_leaf({32, 8, 3, 3}, 62).detach().to(DType::Float32).to(gpu);
  auto forward_and_grads = [&] {
    Tensor xl = x.clone().set_requires_grad(true), wl = w.clone().set_requires_grad(true);
    Tensor y = conv2d(xl, wl, Tensor(), {1, 1}, {1, 1}, {1, 1}, 1);
    y.backward(ones_like(y));
    return std::vector<Tensor>{y.to(Device::cpu(0)), xl.grad().to(Device::cpu(0)), wl.grad().to(Device::cpu(0))};
  };
  const std::vector<Tensor> heuristic = forward_and_grads();
  {
    CudnnBenchmarkOn on;
    // The fastest algorithm may be a Winograd or FFT one, whose float32 rounding error is ~10x a direct
    // sum's; a wrong result or a clobbered output is off by O(1).
    expect_conv2d_matches_cpu(1e-3);
    const std::vector<Tensor> measured = forward_and_grads();
    // |dw| ~ 80 here (6,400 terms): 1e-2 is ~1e-4 relative.
    for (size_t i = 0; i < measured.size(); ++i) EXPECT_LT(max_abs_diff(measured[i], heuristic[i]), 1e-2) << i;
  }
  const std::vector<Tensor> again = forward_and_grads();
  for (size_t i = 0; i < again.size(); ++i) EXPECT_EQ(max_abs_diff(again[i], heuristic[i]), 0.0) << i;
}

// CPU autocast hands the kernels float32 x and dy (Conv2dShape::f32_activations), rounded to bfloat16 while
// they are reordered for oneDNN: every pass must give the bits it gives on the bfloat16 casts themselves (but
// the short forwards, below), and the backward-weights pass makes the bias gradient from the rounded dy.
TEST(Conv2dTest, Bfloat16PassesOnFloat32ActivationsEqualThoseOnTheirCasts) {
  if (!amp::cpu_supports_bf16()) GTEST_SKIP() << "this CPU has no bfloat16 instructions (autocast stays float32)";
  std::vector<ConvConfig> configs(std::begin(kConfigs), std::end(kConfigs));
  configs.push_back({2, 8, 6, 6, 4, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true});  // 72 products per output
  for (const ConvConfig& c : configs) {
    SCOPED_TRACE(describe(c));
    kernels::Conv2dShape s{DType::BFloat16, c.n, c.c_in, c.h, c.w, c.c_out, c.kh, c.kw, c.stride[0], c.stride[1],
                           c.padding[0], c.padding[1], c.dilation[0], c.dilation[1], c.groups};
    kernels::Conv2dShape f32_in = s;
    f32_in.f32_activations = true;
    const Tensor x = randn({c.n, c.c_in, c.h, c.w});
    const Tensor w = randn({c.c_out, c.c_in / c.groups, c.kh, c.kw}).to(DType::BFloat16);
    const Tensor dy = randn({c.n, c.c_out, s.h_out(), s.w_out()});
    const Tensor xb = x.to(DType::BFloat16), dyb = dy.to(DType::BFloat16);
    auto outputs = [&] {
      return std::array<Tensor, 3>{zeros({c.n, c.c_out, s.h_out(), s.w_out()}), zeros({c.n, c.c_in, c.h, c.w}),
                                   zeros({c.c_out, c.c_in / c.groups, c.kh, c.kw})};
    };
    std::array<Tensor, 3> cast = outputs(), direct = outputs();
    kernels::conv2d_forward_cpu(s, xb.data_ptr(), w.data_ptr(), nullptr, cast[0].data_ptr());
    kernels::conv2d_forward_cpu(f32_in, x.data_ptr(), w.data_ptr(), nullptr, direct[0].data_ptr());
    kernels::conv2d_backward_cpu(s, xb.data_ptr(), w.data_ptr(), dyb.data_ptr(), cast[1].data_ptr(),
                                 cast[2].data_ptr(), nullptr);
    Tensor db = zeros({c.c_out});
    kernels::conv2d_backward_cpu(f32_in, x.data_ptr(), w.data_ptr(), dy.data_ptr(), direct[1].data_ptr(),
                                 direct[2].data_ptr(), db.data_ptr());
    // A forward with fewer than 32 products per output runs the float32 kernel on the rounded operands (Note
    // [Short bfloat16 reductions on the float32 kernel], conv_cpu.cc): those bits, and the bfloat16 kernel's
    // values but for the order of the float32 sums.
    const bool short_reduction = (c.c_in / c.groups) * c.kh * c.kw < 32;
    if (short_reduction) {
      kernels::Conv2dShape f32 = s;
      f32.dtype = DType::Float32;
      Tensor want = outputs()[0];
      kernels::conv2d_forward_cpu(f32, xb.to(DType::Float32).data_ptr(), w.to(DType::Float32).data_ptr(), nullptr,
                                  want.data_ptr());
      EXPECT_TRUE(equal(direct[0], want)) << "y: not the float32 kernel's on the rounded operands";
      EXPECT_LT(max_abs_diff(direct[0], cast[0]), 1e-5);
    }
    for (int k = short_reduction ? 1 : 0; k < 3; ++k) {
      EXPECT_TRUE(equal(direct[k], cast[k])) << "output " << k << " (y, dx, dw)";
    }
    // The bias gradient comes with them: the bfloat16 dy summed in float32 (a few float32 roundings).
    const Tensor want_db = sum(dyb.to(DType::Float64), std::vector<int64_t>{0, 2, 3});
    EXPECT_LT(max_abs_diff(db.to(DType::Float64), want_db), 1e-5);
  }
  kernels::Conv2dShape f64 = {DType::Float64, 1, 1, 3, 3, 1, 1, 1};
  f64.f32_activations = true;
  expect_error([&] { kernels::check_conv2d_shape("conv", f64); },
               "conv: float32 activations go with bfloat16 operands only, got dtype float64");
}

// Autocast on CUDA (Note [16-bit convolutions], core/kernels/conv_cuda.cu): each pass multiplies 16-bit
// operands with float32 accumulation and rounds its result to the operand type once before widening it to
// float32. Reference: the float64 convolution of the same rounded operands (x, w forward; dy, w and x, dy
// backward) on CPU. Bound: one rounding (2^-8 relative for bfloat16, 2^-11 for float16) of the largest
// element, doubled for the float32 accumulation. The bias and its gradient stay float32.
TEST(ConvCudaTest, AutocastConv2dRoundsOperandsAndResultOnce) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    const double unit = dtype == DType::BFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    for (const ConvConfig& c : kConfigs) {
      SCOPED_TRACE(describe(c) + " " + std::string(dtype_name(dtype)));
      const Tensor x = randn_leaf({c.n, c.c_in, c.h, c.w}, 61).detach().to(DType::Float32);
      const Tensor w = randn_leaf({c.c_out, c.c_in / c.groups, c.kh, c.kw}, 62).detach().to(DType::Float32);
      const Tensor b = c.bias ? randn_leaf({c.c_out}, 63).detach().to(DType::Float32) : Tensor();
      auto on_gpu = [&](const Tensor& t) { return t.defined() ? t.to(gpu).set_requires_grad(true) : Tensor(); };
      Tensor xg = on_gpu(x), wg = on_gpu(w), bg = on_gpu(b);
      Tensor y;
      {
        amp::AutocastGuard autocast(DeviceKind::CUDA, dtype);
        y = conv2d(xg, wg, bg, c.stride, c.padding, c.dilation, c.groups);
      }
      ASSERT_EQ(y.dtype(), DType::Float32);
      const Tensor dy = randn(y.shape());
      y.backward(dy.to(gpu));

      auto rounded = [&](const Tensor& t) { return t.to(dtype).to(DType::Float64).set_requires_grad(true); };
      Tensor xr = rounded(x), wr = rounded(w), br = c.bias ? b.to(DType::Float64).set_requires_grad(true) : Tensor();
      Tensor yr = conv2d(xr, wr, br, c.stride, c.padding, c.dilation, c.groups);
      yr.backward(dy.to(dtype).to(DType::Float64));
      // `rounded_part`: the value cuDNN rounded (y before the float32 bias is added).
      auto expect_within_one_rounding = [&](const Tensor& got, const Tensor& want, const Tensor& rounded_part,
                                            const char* what) {
        ASSERT_EQ(got.dtype(), DType::Float32) << what;
        const double bound = 2 * unit * max_abs_diff(rounded_part, zeros_like(rounded_part)) + 1e-6;
        EXPECT_LE(max_abs_diff(got.to(Device::cpu(0)).to(DType::Float64), want), bound) << what;
      };
      const Tensor conv_only = conv2d(xr.detach(), wr.detach(), Tensor(), c.stride, c.padding, c.dilation, c.groups);
      expect_within_one_rounding(y, yr, conv_only, "y");
      expect_within_one_rounding(xg.grad(), xr.grad(), xr.grad(), "dx");
      expect_within_one_rounding(wg.grad(), wr.grad(), wr.grad(), "dw");
      if (c.bias) {
        // dbias sums the unrounded float32 dy.
        EXPECT_LE(max_abs_diff(bg.grad().to(Device::cpu(0)), sum(dy, std::vector<int64_t>{0, 2, 3})), 1e-5);
      }
    }
  }
}

// Every pool on `device` against cpu:0, float32 and float64, forward and input gradient.
void expect_pools_match_cpu(Device device) {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    SCOPED_TRACE(dtype == DType::Float32 ? "float32" : "float64");
    std::vector<Tensor> in = leaves({randn_leaf({2, 3, 9, 7}, 61)}, dtype);
    // Pooling runs the same per-element code (pool_math.h) in the same order on both sides: only the
    // compilers' contraction of a * b + c may differ, a few ulps.
    const double tol = dtype == DType::Float32 ? 1e-5 : 1e-13;
    expect_device_matches_cpu([](const std::vector<Tensor>& t) { return max_pool2d(t[0], {3, 3}, {2, 2}, {1, 1}); },
                              in, tol, device);
    // Windows that do not overlap (CUDA scatters to the winners): stride = window, the 9th row and 7th column
    // in no window (their gradient is 0); stride > window with padding.
    expect_device_matches_cpu([](const std::vector<Tensor>& t) { return max_pool2d(t[0], {2, 2}); }, in, tol, device);
    expect_device_matches_cpu([](const std::vector<Tensor>& t) { return max_pool2d(t[0], {2, 2}, {3, 3}, {1, 1}); },
                              in, tol, device);
    // relu(max_pool2d) in one pass (CUDA's kernels, any window; the CPU's window codes or the two ops): windows
    // whose maximum is negative get no gradient.
    expect_device_matches_cpu([](const std::vector<Tensor>& t) { return max_pool2d_relu(t[0], {2, 2}, {2, 2}); }, in,
                              tol, device);
    expect_device_matches_cpu(
        [](const std::vector<Tensor>& t) { return max_pool2d_relu(t[0], {3, 3}, {2, 2}, {1, 1}); }, in, tol, device);
    expect_device_matches_cpu([](const std::vector<Tensor>& t) { return avg_pool2d(t[0], {3, 2}, {1, 2}, {1, 1}); },
                              in, tol, device);
    expect_device_matches_cpu([](const std::vector<Tensor>& t) { return adaptive_avg_pool2d(t[0], {4, 5}); }, in, tol,
                              device);
    expect_device_matches_cpu([](const std::vector<Tensor>& t) { return adaptive_avg_pool2d(t[0], {1, 1}); }, in, tol,
                              device);
  }
}

TEST(ConvCudaTest, PoolsMatchCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  expect_pools_match_cpu(Device::cuda(0));
}

// The comparison itself, where it runs without a GPU: cpu:1 runs the very code cpu:0 does, so any difference
// is the helper's (it once compared gradients accumulated over several calls with fresh ones).
TEST(PoolTest, PoolsOnAnotherCpuDeviceMatchCpu0) { expect_pools_match_cpu(Device::cpu(1)); }

}  // namespace
}  // namespace dpe
