// conv2d_relu_max_pool2d: the fused pass (Note [Convolution, ReLU and pool in one pass]) against the three ops
// it replaces, values and the weight and bias gradients, NCHW and channels last; the composition wherever the
// fused kernel does not apply (x requiring grad, float64, a stride, autocast), bit for bit; conv2d's errors; CUDA's
// composition against the CPU's fused pass (skipped without a GPU).
#include <gtest/gtest.h>

#include <array>
#include <string>
#include <vector>

#include "core/amp/autocast.h"
#include "core/autograd/node.h"
#include "core/device.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops/conv.h"
#include "core/ops/pool.h"

namespace dpe {
namespace {

struct Params {
  Tensor weight, bias;
};

Params make_params(int64_t c_out, int64_t c_in, int64_t k, DType dtype = DType::Float32) {
  return {(randn({c_out, c_in, k, k}, dtype) * 0.3).set_requires_grad(true),
          (randn({c_out}, dtype) * 0.1).set_requires_grad(true)};
}

Tensor composed(const Tensor& x, const Params& p, std::array<int64_t, 2> padding, std::array<int64_t, 2> stride = {1, 1}) {
  return max_pool2d_relu(conv2d(x, p.weight, p.bias, stride, padding), {2, 2}, {2, 2});
}

Params copy_of(const Params& p) {
  return {p.weight.detach().clone().set_requires_grad(p.weight.requires_grad()),
          p.bias.detach().clone().set_requires_grad(p.bias.requires_grad())};
}

TEST(ConvReluMaxPoolTest, FusedPassMatchesTheThreeOps) {
  struct Case {
    int64_t n, c_in, h, w, c_out, k, pad;
    MemoryFormat format;
  };
  for (const Case& c : {Case{4, 1, 28, 28, 32, 3, 1, MemoryFormat::Contiguous},
                        Case{4, 1, 28, 28, 32, 3, 1, MemoryFormat::ChannelsLast},
                        Case{3, 3, 9, 11, 13, 3, 1, MemoryFormat::ChannelsLast},
                        Case{2, 2, 10, 7, 8, 3, 0, MemoryFormat::Contiguous}}) {
    SCOPED_TRACE(detail::str_cat("C_in ", c.c_in, ", C_out ", c.c_out, ", ", c.h, "x", c.w,
                                 c.format == MemoryFormat::ChannelsLast ? ", channels last" : ""));
    const Tensor x = randn({c.n, c.c_in, c.h, c.w}).contiguous(c.format);
    const Params fused_p = make_params(c.c_out, c.c_in, c.k), apart_p = copy_of(fused_p);
    Tensor fused = conv2d_relu_max_pool2d(x, fused_p.weight, fused_p.bias, {1, 1}, {c.pad, c.pad});
    Tensor apart = composed(x, apart_p, {c.pad, c.pad});
    ASSERT_EQ(fused.grad_fn()->name(), "ConvReluMaxPoolBackward");
    ASSERT_EQ(fused.shape(), apart.shape());
    EXPECT_EQ(fused.suggest_memory_format(), apart.suggest_memory_format());
    EXPECT_LT(max_abs_diff(fused, apart), 1e-5);
    const Tensor dy = randn(fused.shape());
    fused.backward(dy);
    apart.backward(dy);
    EXPECT_LT(max_abs_diff(fused_p.weight.grad(), apart_p.weight.grad()), 1e-4);
    EXPECT_LT(max_abs_diff(fused_p.bias.grad(), apart_p.bias.grad()), 1e-4);
  }
}

TEST(ConvReluMaxPoolTest, FrozenWeightOrBiasGetsNoGradient) {
  const Tensor x = randn({2, 1, 8, 8});
  Params frozen_w = make_params(8, 1, 3), apart = copy_of(frozen_w);
  frozen_w.weight.set_requires_grad(false);
  apart.weight.set_requires_grad(false);
  conv2d_relu_max_pool2d(x, frozen_w.weight, frozen_w.bias, {1, 1}, {1, 1}).backward(ones({2, 8, 4, 4}));
  composed(x, apart, {1, 1}).backward(ones({2, 8, 4, 4}));
  EXPECT_FALSE(frozen_w.weight.grad().defined());
  EXPECT_LT(max_abs_diff(frozen_w.bias.grad(), apart.bias.grad()), 1e-5);

  Params frozen_b = make_params(8, 1, 3);
  frozen_b.bias.set_requires_grad(false);
  conv2d_relu_max_pool2d(x, frozen_b.weight, frozen_b.bias, {1, 1}, {1, 1}).backward(ones({2, 8, 4, 4}));
  EXPECT_FALSE(frozen_b.bias.grad().defined());
  EXPECT_TRUE(frozen_b.weight.grad().defined());

  // No bias at all.
  Params p = make_params(8, 1, 3), q = copy_of(p);
  Tensor y = conv2d_relu_max_pool2d(x, p.weight, Tensor(), {1, 1}, {1, 1});
  Tensor want = max_pool2d_relu(conv2d(x, q.weight, Tensor(), {1, 1}, {1, 1}), {2, 2}, {2, 2});
  EXPECT_LT(max_abs_diff(y, want), 1e-5);
  y.backward(ones(y.shape()));
  want.backward(ones(want.shape()));
  EXPECT_LT(max_abs_diff(p.weight.grad(), q.weight.grad()), 1e-4);
}

// Where the fused kernel does not apply, the result is the composition's, bits and graph.
TEST(ConvReluMaxPoolTest, TheThreeOpsWhereTheFusedPassDoesNotApply) {
  auto expect_composition = [](const Tensor& got, const Tensor& want) {
    ASSERT_EQ(got.grad_fn()->name(), want.grad_fn()->name());
    EXPECT_NE(got.grad_fn()->name(), "ConvReluMaxPoolBackward");
    EXPECT_TRUE(equal(got, want));
  };
  {
    SCOPED_TRACE("x requires grad");
    const Tensor x = randn({2, 1, 8, 8}).set_requires_grad(true);
    const Params p = make_params(4, 1, 3);
    Tensor y = conv2d_relu_max_pool2d(x, p.weight, p.bias, {1, 1}, {1, 1});
    expect_composition(y, composed(x, p, {1, 1}));
    sum(y).backward();
    EXPECT_TRUE(x.grad().defined());
  }
  {
    SCOPED_TRACE("float64");
    const Tensor x = randn({2, 1, 8, 8}, DType::Float64);
    const Params p = make_params(4, 1, 3, DType::Float64);
    expect_composition(conv2d_relu_max_pool2d(x, p.weight, p.bias, {1, 1}, {1, 1}), composed(x, p, {1, 1}));
  }
  {
    SCOPED_TRACE("stride 2");
    const Tensor x = randn({2, 1, 12, 12});
    const Params p = make_params(4, 1, 3);
    expect_composition(conv2d_relu_max_pool2d(x, p.weight, p.bias, {2, 2}, {1, 1}), composed(x, p, {1, 1}, {2, 2}));
  }
  {
    SCOPED_TRACE("36 products per output");
    const Tensor x = randn({2, 4, 8, 8});
    const Params p = make_params(4, 4, 3);
    expect_composition(conv2d_relu_max_pool2d(x, p.weight, p.bias, {1, 1}, {1, 1}), composed(x, p, {1, 1}));
  }
  {
    // bfloat16 products are the composition's; without bfloat16 instructions (the CPU's, or this test's capped
    // runs) autocast stays float32 and the fused pass applies.
    SCOPED_TRACE("autocast");
    const Tensor x = randn({2, 1, 8, 8});
    const Params p = make_params(4, 1, 3);
    amp::AutocastGuard autocast(DeviceKind::CPU, DType::BFloat16);
    Tensor y = conv2d_relu_max_pool2d(x, p.weight, p.bias, {1, 1}, {1, 1});
    if (amp::autocast_state().cpu.has_value()) {
      expect_composition(y, composed(x, p, {1, 1}));
    } else {
      EXPECT_EQ(y.grad_fn()->name(), "ConvReluMaxPoolBackward");
    }
  }
}

TEST(ConvReluMaxPoolTest, ArgumentErrorsAreConv2ds) {
  const Params p = make_params(4, 1, 3);
  try {
    conv2d_relu_max_pool2d(randn({2, 3, 8, 8}), p.weight, p.bias, {1, 1}, {1, 1});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("conv2d: expected input (N, C_in=1, H, W), got [2, 3, 8, 8]"),
              std::string::npos)
        << e.what();
  }
}

// CUDA runs the three ops (cuDNN and its max-pool with relu): they must agree with the CPU's fused pass, values
// and the weight and bias gradients (FMA math on both sides, 9 products per output, the sums in other orders; a
// window whose two best candidates are closer than their rounding could give its gradient to another input on
// each side: with N(0, 1) data, about one in 10^7 windows, and 16 images have 10^5).
TEST(ConvReluMaxPoolTest, CudaMatchesTheFusedCpuPass) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  for (MemoryFormat format : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
    SCOPED_TRACE(format == MemoryFormat::ChannelsLast ? "channels last" : "NCHW");
    const Tensor x = randn({16, 1, 28, 28}).contiguous(format);
    const Params cpu = make_params(32, 1, 3);
    const Params cuda{cpu.weight.detach().to(gpu).set_requires_grad(true),
                      cpu.bias.detach().to(gpu).set_requires_grad(true)};
    Tensor y_cpu = conv2d_relu_max_pool2d(x, cpu.weight, cpu.bias, {1, 1}, {1, 1});
    Tensor y_cuda = conv2d_relu_max_pool2d(x.to(gpu), cuda.weight, cuda.bias, {1, 1}, {1, 1});
    ASSERT_EQ(y_cpu.grad_fn()->name(), "ConvReluMaxPoolBackward");
    EXPECT_LT(max_abs_diff(y_cuda.to(Device::cpu(0)), y_cpu), 1e-4);
    const Tensor dy = randn(y_cpu.shape());
    y_cpu.backward(dy);
    y_cuda.backward(dy.to(gpu));
    EXPECT_LT(max_abs_diff(cuda.weight.grad().to(Device::cpu(0)), cpu.weight.grad()), 1e-3);
    EXPECT_LT(max_abs_diff(cuda.bias.grad().to(Device::cpu(0)), cpu.bias.grad()), 1e-3);
  }
}

}  // namespace
}  // namespace dpe
