// Channels-last tensors (Note [Memory formats], core/tensor.h): the format's tensor API, and every op that keeps
// the format (conv2d, the 2x2 max-pool, batch_norm, activations) giving the values and gradients it gives on NCHW
// tensors: bit for bit where the arithmetic is the same (max-pool, ReLU), within a few float32 roundings where
// the kernels sum in another order (oneDNN's NHWC convolutions, BatchNorm's blocked sums).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/amp/autocast.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops/conv.h"
#include "core/ops/norm.h"
#include "core/ops/pool.h"
#include "tests/testing/compare.h"
#include "tests/testing/errors.h"

namespace dpe {
namespace {

using testing::error_of;
using testing::max_relative_diff;

constexpr MemoryFormat kCl = MemoryFormat::ChannelsLast;

std::vector<uint32_t> bits(const Tensor& t) {
  std::vector<float> v = t.to_vector<float>();
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

// Two leaves with the same values: one for the NCHW run, one whose channels-last copy runs.
struct Pair {
  Tensor nchw, cl;
};
Pair leaves(const Tensor& values) {
  return {values.clone().set_requires_grad(true), values.clone().set_requires_grad(true)};
}

// op on a leaf holding `values` and on the channels-last copy of another: a channels-last result (unless the
// output has one pixel, where both formats are the same memory), and outputs and input gradients bit for bit.
void expect_channels_last_gives_the_same_bits(const Tensor& values, const std::function<Tensor(const Tensor&)>& op) {
  Pair x = leaves(values);
  Tensor y_nchw = op(x.nchw), y_cl = op(x.cl.contiguous(kCl));
  if (y_cl.size(2) * y_cl.size(3) > 1) {
    EXPECT_EQ(y_cl.suggest_memory_format(), kCl);
  }
  EXPECT_EQ(bits(y_cl), bits(y_nchw));
  Tensor dy = randn(y_nchw.shape());
  y_nchw.backward(dy);
  y_cl.backward(dy);
  EXPECT_EQ(bits(x.cl.grad()), bits(x.nchw.grad()));
}

TEST(ChannelsLastTest, TheFormatsOfTensors) {
  Tensor x = randn({2, 3, 4, 5});
  EXPECT_TRUE(x.is_contiguous(MemoryFormat::Contiguous));
  EXPECT_FALSE(x.is_contiguous(kCl));
  EXPECT_EQ(x.suggest_memory_format(), MemoryFormat::Contiguous);
  EXPECT_TRUE(x.contiguous(MemoryFormat::Contiguous).is_same(x));

  Tensor y = x.contiguous(kCl);
  EXPECT_EQ(y.strides(), (Shape{60, 1, 15, 3}));
  EXPECT_TRUE(y.is_contiguous(kCl));
  EXPECT_FALSE(y.is_contiguous());
  EXPECT_EQ(y.suggest_memory_format(), kCl);
  EXPECT_EQ(y.to_vector<float>(), x.to_vector<float>());
  EXPECT_TRUE(y.contiguous(kCl).is_same(y));  // already so: no copy
  // contiguous() is NCHW again; clone and to() keep what they are given (PyTorch's preserve_format).
  EXPECT_EQ(y.contiguous().strides(), (Shape{60, 20, 5, 1}));
  EXPECT_EQ(y.contiguous().to_vector<float>(), x.to_vector<float>());
  EXPECT_EQ(y.clone().strides(), y.strides());
  EXPECT_EQ(y.to(DType::Float64).strides(), y.strides());
  EXPECT_EQ(y.to(Device::cpu(1)).strides(), y.strides());
  EXPECT_EQ(y.to(Device::cpu(1)).to_vector<float>(), x.to_vector<float>());
  EXPECT_EQ(Tensor::empty({2, 3, 4, 5}, {}, kCl).strides(), (Shape{60, 1, 15, 3}));

  // One channel: NCHW and NHWC are the same memory, so no copy, but channels-last's strides.
  Tensor gray = randn({2, 1, 4, 5});
  EXPECT_TRUE(gray.is_contiguous(kCl));
  EXPECT_EQ(gray.suggest_memory_format(), MemoryFormat::Contiguous);
  Tensor gray_cl = gray.contiguous(kCl);
  EXPECT_EQ(gray_cl.data_ptr(), gray.data_ptr());
  EXPECT_EQ(gray_cl.strides(), (Shape{20, 1, 5, 1}));
  EXPECT_EQ(gray_cl.suggest_memory_format(), kCl);
  // A narrowed batch (DP's scatter) keeps the format.
  EXPECT_EQ(y.narrow(0, 1, 1).suggest_memory_format(), kCl);

  EXPECT_NE(error_of([] { randn({2, 3}).contiguous(kCl); })
                .find("contiguous(ChannelsLast): channels-last tensors are 4-d (N, C, H, W), got [2, 3]"),
            std::string::npos);
  EXPECT_NE(error_of([] { Tensor::empty({2, 3, 4}, {}, kCl); })
                .find("empty(ChannelsLast): channels-last tensors are 4-d (N, C, H, W), got [2, 3, 4]"),
            std::string::npos);
}

TEST(ChannelsLastTest, ConversionsAreDifferentiable) {
  for (const Shape& shape : {Shape{2, 3, 4, 5}, Shape{2, 1, 4, 5}}) {
    Tensor x = randn(shape).set_requires_grad(true), w = randn(shape);
    sum(mul(x.contiguous(kCl), w)).backward();
    EXPECT_EQ(x.grad().to_vector<float>(), w.to_vector<float>());
  }
}

TEST(ChannelsLastTest, Conv2dEqualsNchw) {
  struct Case {
    int64_t c_in, c_out, h, w, pad;
  };
  for (const Case& c : {Case{3, 8, 9, 9, 1}, Case{1, 16, 12, 10, 1}, Case{16, 32, 7, 7, 0}}) {
    // Autocast: bfloat16 products, or float32 where dpe runs without bfloat16 instructions (the capped runs).
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(detail::str_cat("C_in ", c.c_in, " C_out ", c.c_out, bf16 ? " autocast" : " float32"));
      Pair x = leaves(randn({4, c.c_in, c.h, c.w}));
      Pair w = leaves(mul(randn({c.c_out, c.c_in, 3, 3}), 0.3));
      Pair b = leaves(randn({c.c_out}));
      Tensor dy;
      Tensor y_nchw, y_cl;
      {
        std::optional<amp::AutocastGuard> autocast;
        if (bf16) autocast.emplace(DeviceKind::CPU, DType::BFloat16);
        y_nchw = conv2d(x.nchw, w.nchw, b.nchw, {1, 1}, {c.pad, c.pad});
        y_cl = conv2d(x.cl.contiguous(kCl), w.cl, b.cl, {1, 1}, {c.pad, c.pad});
      }
      EXPECT_EQ(y_nchw.suggest_memory_format(), MemoryFormat::Contiguous);
      EXPECT_EQ(y_cl.suggest_memory_format(), kCl);
      EXPECT_LT(max_relative_diff(y_cl, y_nchw), 1e-5);
      dy = randn(y_nchw.shape());
      y_nchw.backward(dy);
      y_cl.backward(dy);
      EXPECT_LT(max_relative_diff(x.cl.grad(), x.nchw.grad()), 1e-5);
      EXPECT_LT(max_relative_diff(w.cl.grad(), w.nchw.grad()), 1e-5);
      EXPECT_LT(max_relative_diff(b.cl.grad(), b.nchw.grad()), 1e-5);
    }
  }
}

// float64 convolutions (im2col) run on an NCHW copy and hand the result back channels last, the same values.
TEST(ChannelsLastTest, Float64Conv2dRunsOnAnNchwCopy) {
  Tensor x = randn({2, 3, 6, 6}, DType::Float64), w = randn({4, 3, 3, 3}, DType::Float64);
  Tensor y = conv2d(x.contiguous(kCl), w, Tensor(), {1, 1}, {1, 1});
  EXPECT_EQ(y.suggest_memory_format(), kCl);
  EXPECT_EQ(y.to_vector<double>(), conv2d(x, w, Tensor(), {1, 1}, {1, 1}).to_vector<double>());
}

// Binary ops follow a channels-last operand of the result's shape (either side), broadcasting included, and run
// in NHWC order: the same values and gradients as on NCHW tensors.
TEST(ChannelsLastTest, BinaryOpsKeepTheFormat) {
  const Tensor a = randn({2, 5, 3, 4}), b = randn({2, 5, 3, 4}), bias = randn({1, 5, 1, 1});
  struct Case {
    const char* what;
    bool a_cl, b_cl;
    Tensor b_values;
  };
  for (const Case& c : {Case{"both", true, true, b}, Case{"first", true, false, b}, Case{"second", false, true, b},
                        Case{"broadcast bias", true, false, bias}}) {
    SCOPED_TRACE(c.what);
    Pair x = leaves(a), y = leaves(c.b_values);
    auto as = [](const Tensor& t, bool cl) { return cl && t.dim() == 4 && t.size(2) > 1 ? t.contiguous(kCl) : t; };
    Tensor sum_nchw = mul(add(x.nchw, y.nchw), y.nchw);
    Tensor sum_cl = mul(add(as(x.cl, c.a_cl), as(y.cl, c.b_cl)), as(y.cl, c.b_cl));
    EXPECT_EQ(sum_cl.suggest_memory_format(), kCl);
    EXPECT_EQ(bits(sum_cl), bits(sum_nchw));
    Tensor dy = randn(sum_nchw.shape());
    sum_nchw.backward(dy);
    sum_cl.backward(dy);
    EXPECT_EQ(bits(x.cl.grad()), bits(x.nchw.grad()));
    EXPECT_LT(max_relative_diff(y.cl.grad(), y.nchw.grad()), 1e-6);  // bias: summed over N, H, W in either order
  }
}

// Pools without channels-last kernels run on NCHW copies and hand their results back channels last: the same
// bits.
TEST(ChannelsLastTest, OtherPoolsKeepTheFormat) {
  const Tensor values = randn({2, 6, 9, 9});
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> pools = {
      {"max 3x3 stride 2 pad 1", [](const Tensor& t) { return max_pool2d(t, {3, 3}, {2, 2}, {1, 1}); }},
      {"max 2x2 with indices", [](const Tensor& t) { return max_pool2d_with_indices(t, {2, 2}, {2, 2}).values; }},
      {"relu of max 3x3", [](const Tensor& t) { return max_pool2d_relu(t, {3, 3}, {2, 2}, {1, 1}); }},
      {"avg 2x2", [](const Tensor& t) { return avg_pool2d(t, {2, 2}); }},
      {"adaptive 3x3", [](const Tensor& t) { return adaptive_avg_pool2d(t, {3, 3}); }},
  };
  for (const auto& [what, pool] : pools) {
    SCOPED_TRACE(what);
    expect_channels_last_gives_the_same_bits(values, pool);
  }
}

// The channels-last 2x2 kernels compare the same four values in the same order as the NCHW ones: values and
// gradients bit for bit, for channel counts with and without a vector tail, odd sizes, ties and NaNs.
TEST(ChannelsLastTest, MaxPool2x2EqualsNchwBitForBit) {
  std::mt19937 gen(5);
  std::uniform_int_distribution<int> small(-3, 3);
  for (int64_t channels : {1, 3, 8, 13, 32}) {
    for (auto [h, w] : {std::pair<int64_t, int64_t>{4, 6}, {5, 7}, {2, 2}}) {
      SCOPED_TRACE(detail::str_cat("C ", channels, ", ", h, "x", w));
      std::vector<float> values(static_cast<size_t>(2 * channels * h * w));
      for (float& v : values) v = static_cast<float>(small(gen));
      values[3] = std::numeric_limits<float>::quiet_NaN();
      expect_channels_last_gives_the_same_bits(Tensor::from_vector(values, {2, channels, h, w}),
                                               [](const Tensor& t) { return max_pool2d(t, {2, 2}); });
    }
  }
}

TEST(ChannelsLastTest, BatchNormEqualsNchw) {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (bool training : {true, false}) {
      SCOPED_TRACE(detail::str_cat(dtype, training ? " training" : " eval"));
      const double tolerance = dtype == DType::Float64 ? 1e-12 : 1e-5;
      Pair x = leaves(add(mul(randn({4, 6, 5, 7}, dtype), 3.0), 1.0));
      Pair w = leaves(randn({6}, dtype)), b = leaves(randn({6}, dtype));
      Tensor mean_nchw = randn({6}, dtype), var_nchw = add(square(randn({6}, dtype)), 0.5);
      Tensor mean_cl = mean_nchw.clone(), var_cl = var_nchw.clone();
      Tensor y_nchw = batch_norm(x.nchw, mean_nchw, var_nchw, w.nchw, b.nchw, training, 0.1, 1e-5);
      Tensor y_cl = batch_norm(x.cl.contiguous(kCl), mean_cl, var_cl, w.cl, b.cl, training, 0.1, 1e-5);
      EXPECT_EQ(y_cl.suggest_memory_format(), kCl);
      EXPECT_LT(max_relative_diff(y_cl, y_nchw), tolerance);
      EXPECT_LT(max_relative_diff(mean_cl, mean_nchw), tolerance);
      EXPECT_LT(max_relative_diff(var_cl, var_nchw), tolerance);
      Tensor dy = randn(y_nchw.shape(), dtype);
      y_nchw.backward(dy);
      y_cl.backward(dy);
      EXPECT_LT(max_relative_diff(x.cl.grad(), x.nchw.grad()), tolerance);
      EXPECT_LT(max_relative_diff(w.cl.grad(), w.nchw.grad()), tolerance);
      EXPECT_LT(max_relative_diff(b.cl.grad(), b.nchw.grad()), tolerance);
    }
  }
}

// Activations run over memory order, so a channels-last input gives a channels-last output; the gradient of
// an NCHW dy (what a reshape hands back) is put in the input's format first.
TEST(ChannelsLastTest, ActivationsKeepTheFormat) {
  expect_channels_last_gives_the_same_bits(randn({2, 5, 3, 4}), [](const Tensor& t) { return relu(t); });
}

// On CUDA the ops take channels-last inputs through NCHW copies (cuDNN and the CUDA kernels get NCHW) and hand
// back channels-last results with the values of NCHW inputs.
TEST(ChannelsLastTest, CudaOpsTakeChannelsLastInputs) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  Pair x = leaves(randn({4, 3, 8, 8}).to(gpu));
  const Tensor w = mul(randn({6, 3, 3, 3}), 0.3).to(gpu), b = randn({6}).to(gpu);
  auto chain = [&](const Tensor& in) {
    Tensor mean = zeros({6}).to(gpu), var = ones({6}).to(gpu);
    Tensor y = conv2d(in, w, b, {1, 1}, {1, 1});
    return relu(max_pool2d(batch_norm(y, mean, var, Tensor(), Tensor(), true, 0.1, 1e-5), {2, 2}));
  };
  Tensor y_nchw = chain(x.nchw), y_cl = chain(x.cl.contiguous(kCl));
  EXPECT_EQ(y_cl.suggest_memory_format(), kCl);
  EXPECT_LT(max_relative_diff(y_cl.to(Device::cpu(0)), y_nchw.to(Device::cpu(0))), 1e-5);
  Tensor dy = randn(y_nchw.shape()).to(gpu);
  y_nchw.backward(dy);
  y_cl.backward(dy);
  EXPECT_LT(max_relative_diff(x.cl.grad().to(Device::cpu(0)), x.nchw.grad().to(Device::cpu(0))), 1e-5);
  EXPECT_EQ(relu(x.cl.detach().contiguous(kCl)).suggest_memory_format(), kCl);
}

}  // namespace
}  // namespace dpe
