// sgd_step_cpu against PyTorch's SGD formula evaluated in double, for every option combination, over three
// steps (the first writes the momentum buffer, later ones read it), on both the serial and parallel paths.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/kernels/optimizer.h"
#include "tests/testing/kernel_test_util.h"

namespace dpe::kernels {
namespace {

template <typename T>
class OptimizerCpu : public ::testing::Test {};
TYPED_TEST_SUITE(OptimizerCpu, FloatTypes);

// torch.optim.SGD (foreach=False), one element, in double.
void reference_sgd(double& p, double g, double& buf, const SgdStep& s) {
  double d = g + s.weight_decay * p;
  if (s.momentum != 0) {
    buf = s.first_step ? d : s.momentum * buf + (1 - s.dampening) * d;
    d = s.nesterov ? d + s.momentum * buf : buf;
  }
  p -= s.lr * d;
}

TYPED_TEST(OptimizerCpu, SgdStepMatchesPyTorchsFormula) {
  using T = TypeParam;
  const double tolerance = std::is_same_v<T, float> ? 2e-6 : 1e-14;
  const SgdStep variants[] = {
      {.lr = 0.1},
      {.lr = 0.1, .momentum = 0.9},
      {.lr = 0.1, .momentum = 0.9, .dampening = 0.3},
      {.lr = 0.05, .momentum = 0.9, .nesterov = true},
      {.lr = 0.1, .momentum = 0.5, .weight_decay = 0.01},
      {.lr = 0.1, .weight_decay = 0.2},
  };
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{100003}}) {
    for (const SgdStep& variant : variants) {
      std::vector<T> p = random_vector<T>(n, -1, 1, 11), buf(n, T(-99));  // garbage until the first step
      std::vector<double> ref_p(p.begin(), p.end()), ref_buf(n, 0.0);
      for (int step = 0; step < 3; ++step) {
        const std::vector<T> g = random_vector<T>(n, -1, 1, 20 + step);
        SgdStep s = variant;
        s.first_step = step == 0;
        sgd_step_cpu(dtype_of<T>(), n, p.data(), g.data(), variant.momentum != 0 ? buf.data() : nullptr, s);
        for (int64_t i = 0; i < n; ++i) reference_sgd(ref_p[i], g[i], ref_buf[i], s);
      }
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(p[i], ref_p[i], tolerance * (1 + std::abs(ref_p[i]))) << "n " << n << " i " << i;
        if (variant.momentum != 0) {
          ASSERT_NEAR(buf[i], ref_buf[i], tolerance * (1 + std::abs(ref_buf[i])));
        }
      }
    }
  }
}

}  // namespace
}  // namespace dpe::kernels
