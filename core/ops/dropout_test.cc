// dropout op: mask statistics, scale, eval identity, reproducibility, per-device generators, errors.
#include "core/ops/dropout.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "core/ops.h"
#include "tests/testing/gradcheck.h"

namespace dpe {
namespace {

TEST(DropoutOpTest, MaskMeanAndScale) {
  manual_seed(42);
  const int64_t n = 100000;
  for (double p : {0.1, 0.5, 0.8}) {
    SCOPED_TRACE(p);
    std::vector<float> y = dropout(ones({n}), p, true).to_vector<float>();
    int64_t kept = 0;
    const float scale = static_cast<float>(1.0 / (1.0 - p));
    for (float v : y) {
      ASSERT_TRUE(v == 0.0f || v == scale) << v;
      kept += v != 0.0f;
    }
    // kept ~ Binomial(n, 1 - p): standard deviation sqrt(n p (1-p)) <= 158; allow 6 of them.
    const double sd = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(static_cast<double>(kept), n * (1 - p), 6 * sd);
  }
}

TEST(DropoutOpTest, EvalAndZeroAreIdentityOneIsZeros) {
  Tensor x = randn({4, 5});
  EXPECT_TRUE(dropout(x, 0.5, false).is_same(x));
  EXPECT_TRUE(dropout(x, 0.0, true).is_same(x));
  Tensor leaf = randn({3}).set_requires_grad(true);
  Tensor y = dropout(leaf, 1.0, true);
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{0, 0, 0}));
  y.backward(ones({3}));
  EXPECT_EQ(leaf.grad().to_vector<float>(), (std::vector<float>{0, 0, 0}));
}

TEST(DropoutOpTest, ProbabilityOutsideUnitIntervalIsAnError) {
  try {
    dropout(ones({2}), 1.5, true);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("between 0 and 1, but got 1.5"), std::string::npos) << e.what();
  }
  EXPECT_THROW(dropout(ones({2}), -0.5, false), Error);  // checked even in eval, like PyTorch
}

TEST(DropoutOpTest, SameSeedSameMaskAndGeneratorsArePerDevice) {
  Tensor x = ones({1000});
  manual_seed(7);
  Tensor a = dropout(x, 0.5, true);
  Tensor b = dropout(x, 0.5, true);  // the generator advanced: another mask
  manual_seed(7);
  EXPECT_TRUE(equal(dropout(x, 0.5, true), a));
  EXPECT_FALSE(equal(a, b));
  // An explicit generator: same seed, same mask; the device's default generator is untouched.
  const uint64_t offset = default_generator(Device::cpu(0)).offset();
  Generator g1(123), g2(123);
  EXPECT_TRUE(equal(dropout(x, 0.3, true, &g1), dropout(x, 0.3, true, &g2)));
  EXPECT_EQ(default_generator(Device::cpu(0)).offset(), offset);
  // cpu:1 draws from its own generator: using it leaves cpu:0's stream where it was.
  manual_seed(7);
  Tensor on1 = dropout(x.to(Device::cpu(1)), 0.5, true);
  EXPECT_EQ(default_generator(Device::cpu(0)).offset(), 0u);
  EXPECT_GT(default_generator(Device::cpu(1)).offset(), 0u);
  EXPECT_TRUE(equal(dropout(x, 0.5, true), a));  // cpu:0's first mask after the seed, as before
  EXPECT_TRUE(equal(on1.to(Device::cpu(0)), a));   // same seed and offset on another device: same mask
}

TEST(DropoutOpTest, GradientIsMaskTimesScale) {
  manual_seed(3);
  Tensor x = testing::randn_leaf({50}, 1);
  Tensor y = dropout(x, 0.4, true);
  y.backward(ones({50}, DType::Float64));
  std::vector<double> xv = x.detach().to_vector<double>(), yv = y.to_vector<double>(), g = x.grad().to_vector<double>();
  for (int i = 0; i < 50; ++i) {
    const double expected = yv[i] == 0.0 ? 0.0 : 1.0 / 0.6;
    EXPECT_NEAR(g[i], expected, 1e-12);
    if (yv[i] != 0.0) {
      EXPECT_NEAR(yv[i], xv[i] / 0.6, 1e-12);
    }
  }
}

TEST(DropoutOpTest, CudaMaskEqualsCpuMask) {
  if (!dpe::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Tensor x = ones({4096});
  Generator g_cpu(99), g_gpu(99);
  // Philox: the same (seed, offset) gives the same mask on both backends.
  EXPECT_TRUE(equal(dropout(x.to(Device::cuda(0)), 0.5, true, &g_gpu).to(Device::cpu(0)), dropout(x, 0.5, true, &g_cpu)));
}

}  // namespace
}  // namespace dpe
