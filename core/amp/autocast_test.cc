// Autocast (core/amp/autocast.h): the guard's state and its errors, and that matmul, linear and conv2d under
// it compute exactly what float32 computes on bfloat16-rounded operands, forward and backward; the cast cache.
// Golden values from PyTorch's own autocast are in layers/autocast_golden_test.cc.
#include "core/amp/autocast.h"

#include <gtest/gtest.h>

#include "core/autograd/grad_mode.h"
#include "core/ops.h"
#include "core/ops/conv.h"
#include "tests/testing/errors.h"

namespace dpe::amp {
namespace {

// t rounded to bfloat16 and back: what an autocast product reads.
Tensor rounded(const Tensor& t) { return t.detach().to(DType::BFloat16).to(DType::Float32); }

void expect_close(const Tensor& got, const Tensor& want, double rtol, const char* what) {
  ASSERT_EQ(got.dtype(), DType::Float32) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const double scale = max_abs_diff(want, zeros(want.shape()));
  EXPECT_LE(max_abs_diff(got, want), rtol * scale) << what;
}

#define SKIP_WITHOUT_BF16()                                                                                   \
  if (!cpu_supports_bf16()) GTEST_SKIP() << "this CPU has no bfloat16 instructions: CPU autocast stays float32 " \
                                            "here (its fallback is tested by FallsBackWithoutBf16Instructions)"

TEST(Autocast, GuardSetsNestsAndRestoresTheState) {
  EXPECT_FALSE(autocast_state().cpu.has_value());
  EXPECT_EQ(autocast_state().depth, 0);
  {
    AutocastGuard outer(DeviceKind::CUDA);
    EXPECT_EQ(autocast_state().cuda, DType::Float16);  // PyTorch's CUDA default
    EXPECT_FALSE(autocast_state().cpu.has_value());
    {
      AutocastGuard inner(DeviceKind::CUDA, DType::BFloat16, /*enabled=*/false);
      EXPECT_FALSE(autocast_state().cuda.has_value());
      EXPECT_EQ(autocast_state().depth, 2);
    }
    EXPECT_EQ(autocast_state().cuda, DType::Float16);
  }
  EXPECT_FALSE(autocast_state().cuda.has_value());
  EXPECT_EQ(autocast_state().depth, 0);
  EXPECT_EQ(default_autocast_dtype(DeviceKind::CPU), DType::BFloat16);
}

TEST(Autocast, RefusesTypesThatAreNotLowerPrecision) {
  EXPECT_NE(testing::error_of([] { AutocastGuard g(DeviceKind::CPU, DType::Float16); })
                .find("autocast(cpu): dtype float16 is not supported on CPU"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] { AutocastGuard g(DeviceKind::CUDA, DType::Float64); })
                .find("autocast(cuda): dtype float64 is not a lower-precision type; expected bfloat16 or float16"),
            std::string::npos);
  EXPECT_EQ(autocast_state().depth, 0);  // a refused guard changed nothing
}

TEST(Autocast, MatmulMultipliesRoundedOperandsInFloat32ForwardAndBackward) {
  SKIP_WITHOUT_BF16();
  Tensor a = randn({3, 17, 40}).set_requires_grad(true);
  Tensor b = randn({40, 9}).set_requires_grad(true);
  Tensor g = randn({3, 17, 9});
  Tensor out;
  {
    AutocastGuard autocast(DeviceKind::CPU);
    out = matmul(a, b);
  }
  out.backward(g);  // outside the guard, as PyTorch users write it: still bfloat16 GEMMs
  expect_close(out, matmul(rounded(a), rounded(b)), 1e-6, "out");
  // dA = dY @ B^T and dB = A^T @ dY, each on bfloat16 operands.
  expect_close(a.grad(), matmul(rounded(g), rounded(b).t()), 1e-6, "da");
  expect_close(b.grad(), matmul(rounded(a).reshape({-1, 40}).t(), rounded(g).reshape({-1, 9})), 1e-6, "db");
  // And it is not float32: the operands' rounding shows (2^-8 relative per element).
  EXPECT_GT(max_abs_diff(out, matmul(a.detach(), b.detach())), 1e-4);
}

TEST(Autocast, LinearAndConv2dUseRoundedOperandsAndFloat32Bias) {
  SKIP_WITHOUT_BF16();
  Tensor x = randn({8, 30}).set_requires_grad(true);
  Tensor w = randn({12, 30}).set_requires_grad(true), bias = randn({12}).set_requires_grad(true);
  Tensor img = randn({2, 3, 9, 9}).set_requires_grad(true);
  Tensor kernel = randn({5, 3, 3, 3}).set_requires_grad(true), kbias = randn({5}).set_requires_grad(true);
  Tensor y, z;
  {
    AutocastGuard autocast(DeviceKind::CPU, DType::BFloat16);
    y = linear(x, w, bias);
    z = conv2d(img, kernel, kbias, {1, 1}, {1, 1});
  }
  expect_close(y, linear(rounded(x), rounded(w), bias.detach()), 1e-6, "linear");
  expect_close(z, conv2d(rounded(img), rounded(kernel), kbias.detach(), {1, 1}, {1, 1}), 1e-5, "conv2d");
  Tensor dz = randn(z.shape());
  (sum(y) + sum(z * dz)).backward();
  // conv2d's input gradient on rounded dz and weight. The bias gradients are float32 sums: linear's of the
  // float32 gradient, conv2d's of the rounded one its products read (as PyTorch's bfloat16 convolution sums it).
  Tensor img_ref = rounded(img).set_requires_grad(true);
  conv2d(img_ref, rounded(kernel), Tensor(), {1, 1}, {1, 1}).backward(rounded(dz));
  expect_close(img.grad(), img_ref.grad(), 1e-5, "conv2d dx");
  expect_close(kbias.grad(), sum(rounded(dz), std::vector<int64_t>{0, 2, 3}), 1e-6, "conv2d dbias");
  expect_close(bias.grad(), full({12}, 8.0), 0, "linear dbias");
}

// The conv2d bias gradient under CPU autocast is the same sum whether the weight trains (the backward-weights
// pass makes it) or is frozen (a sum of its own).
TEST(Autocast, Conv2dBiasGradientIsTheSameWithAFrozenWeight) {
  SKIP_WITHOUT_BF16();
  Tensor img = randn({2, 3, 9, 9});
  Tensor dz = randn({2, 5, 9, 9});
  std::vector<Tensor> grads;
  for (bool train_weight : {true, false}) {
    Tensor kernel = randn({5, 3, 3, 3}).set_requires_grad(train_weight), kbias = randn({5}).set_requires_grad(true);
    Tensor z;
    {
      AutocastGuard autocast(DeviceKind::CPU, DType::BFloat16);
      z = conv2d(img, kernel, kbias, {1, 1}, {1, 1});
    }
    z.backward(dz);
    grads.push_back(kbias.grad());
  }
  expect_close(grads[1], grads[0], 1e-6, "bias gradient, weight frozen against trained");
  expect_close(grads[0], sum(rounded(dz), std::vector<int64_t>{0, 2, 3}), 1e-6, "bias gradient");
}

TEST(Autocast, Float64OperandsAreLeftAlone) {
  Tensor a = randn({4, 6}, DType::Float64), b = randn({6, 3}, DType::Float64);
  AutocastGuard autocast(DeviceKind::CPU);
  Tensor out = matmul(a, b);
  EXPECT_EQ(out.dtype(), DType::Float64);
  NoGradGuard no_grad;
  EXPECT_EQ(max_abs_diff(out, matmul(a, b)), 0.0);
}

// PyTorch's cast cache: a parameter is cast once per outermost guard, so an in-place change inside the guard
// is not seen until the guard ends (why DataParallel clears the cache after its optimizer step).
TEST(Autocast, ParameterCastsAreCachedUntilTheOutermostGuardEnds) {
  SKIP_WITHOUT_BF16();
  Tensor x = randn({4, 10});
  Tensor w = randn({3, 10}).set_requires_grad(true);
  Tensor before, stale, after;
  {
    AutocastGuard autocast(DeviceKind::CPU);
    before = linear(x, w);
    {
      NoGradGuard no_grad;
      w.mul_(2.0);
    }
    stale = linear(x, w);
    clear_autocast_cache();
    after = linear(x, w);
  }
  NoGradGuard no_grad;
  EXPECT_EQ(max_abs_diff(before, stale), 0.0);  // the cached cast of the old weight
  expect_close(after, before * 2.0, 1e-6, "after clear_autocast_cache");
  {
    AutocastGuard autocast(DeviceKind::CPU);
    expect_close(linear(x, w), before * 2.0, 1e-6, "a new outermost guard");
  }
}

TEST(Autocast, FallsBackWithoutBf16Instructions) {
  if (cpu_supports_bf16()) GTEST_SKIP() << "this CPU has bfloat16 instructions (ONEDNN_MAX_CPU_ISA=AVX512_CORE "
                                           "hides them: //core:autocast_without_bf16_test runs this so)";
  Tensor a = randn({5, 7}), b = randn({7, 2});
  AutocastGuard autocast(DeviceKind::CPU);
  EXPECT_FALSE(autocast_state().cpu.has_value());
  NoGradGuard no_grad;
  Tensor out = matmul(a, b);
  EXPECT_EQ(max_abs_diff(out, matmul(a, b)), 0.0);
}

}  // namespace
}  // namespace dpe::amp
