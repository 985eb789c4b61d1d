// softmax_cpu / softmax_backward_cpu against double references over (outer, size, inner), stability
// with large inputs, and a finite-difference check of the backward formulas in float64.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/kernels/softmax.h"
#include "tests/testing/kernel_test_util.h"

namespace dpe::kernels {
namespace {

// float32 computes exp in float (a few ulps) and each output rounds once or twice.
template <typename T>
double tolerance() {
  return std::is_same_v<T, float> ? 2e-6 : 1e-14;
}

const AxisShape kShapes[] = {{1, 1, 1},    {3, 7, 1},    {2, 10, 300}, {5, 1023, 1}, {64, 1000, 1},
                             {2, 50, 700}, {3, 1, 4},    {0, 4, 4},    {2, 0, 3}};
const SoftmaxKind kKinds[] = {SoftmaxKind::Softmax, SoftmaxKind::LogSoftmax};

double at(const std::vector<double>& v, const AxisShape& s, int64_t o, int64_t k, int64_t i) {
  return v[(o * s.size + k) * s.inner + i];
}

std::vector<double> reference_forward(SoftmaxKind kind, const AxisShape& s, const std::vector<double>& x) {
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < s.outer; ++o) {
    for (int64_t i = 0; i < s.inner; ++i) {
      double m = -INFINITY, sum = 0;
      for (int64_t k = 0; k < s.size; ++k) m = std::max(m, at(x, s, o, k, i));
      for (int64_t k = 0; k < s.size; ++k) sum += std::exp(at(x, s, o, k, i) - m);
      for (int64_t k = 0; k < s.size; ++k) {
        const double v = at(x, s, o, k, i);
        y[(o * s.size + k) * s.inner + i] = kind == SoftmaxKind::Softmax ? std::exp(v - m) / sum : v - m - std::log(sum);
      }
    }
  }
  return y;
}

std::vector<double> reference_backward(SoftmaxKind kind, const AxisShape& s, const std::vector<double>& y,
                                       const std::vector<double>& dy) {
  std::vector<double> dx(y.size());
  for (int64_t o = 0; o < s.outer; ++o) {
    for (int64_t i = 0; i < s.inner; ++i) {
      double sum = 0;
      for (int64_t k = 0; k < s.size; ++k) {
        sum += kind == SoftmaxKind::Softmax ? at(dy, s, o, k, i) * at(y, s, o, k, i) : at(dy, s, o, k, i);
      }
      for (int64_t k = 0; k < s.size; ++k) {
        const double yv = at(y, s, o, k, i), g = at(dy, s, o, k, i);
        dx[(o * s.size + k) * s.inner + i] = kind == SoftmaxKind::Softmax ? yv * (g - sum) : g - std::exp(yv) * sum;
      }
    }
  }
  return dx;
}

template <typename T>
class SoftmaxCpu : public ::testing::Test {};
TYPED_TEST_SUITE(SoftmaxCpu, FloatTypes);

TYPED_TEST(SoftmaxCpu, ForwardMatchesDoubleReference) {
  using T = TypeParam;
  for (const AxisShape& s : kShapes) {
    const int64_t n = s.outer * s.size * s.inner;
    const std::vector<T> x = random_vector<T>(n, -8.0, 8.0, 1);
    for (SoftmaxKind kind : kKinds) {
      std::vector<T> y(static_cast<size_t>(n) + 1, T(-5));
      softmax_cpu(kind, dtype_of<T>(), s.outer, s.size, s.inner, x.data(), y.data());
      const std::vector<double> want = reference_forward(kind, s, std::vector<double>(x.begin(), x.end()));
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(y[i], want[i], tolerance<T>() * std::max(1.0, std::fabs(want[i])))
            << "kind " << int(kind) << " shape " << s.outer << "," << s.size << "," << s.inner << " at " << i;
      }
      EXPECT_EQ(y[n], T(-5)) << "wrote past the end";
    }
  }
}

TYPED_TEST(SoftmaxCpu, ExactValuesAndStability) {
  using T = TypeParam;
  // Equal logits: exactly uniform; huge logits do not overflow; -inf logits get probability 0.
  const std::vector<T> x = {T(3), T(3), T(3), T(3), T(1000), T(1000), T(-1e4), -std::numeric_limits<T>::infinity()};
  std::vector<T> y(8);
  softmax_cpu(SoftmaxKind::Softmax, dtype_of<T>(), 2, 4, 1, x.data(), y.data());
  EXPECT_EQ(y, (std::vector<T>{T(0.25), T(0.25), T(0.25), T(0.25), T(0.5), T(0.5), T(0), T(0)}));
  softmax_cpu(SoftmaxKind::LogSoftmax, dtype_of<T>(), 2, 4, 1, x.data(), y.data());
  EXPECT_NEAR(y[0], -std::log(4.0), tolerance<T>());
  EXPECT_NEAR(y[4], -std::log(2.0), tolerance<T>());
  EXPECT_NEAR(y[6], -1e4 - 1000 - std::log(2.0), tolerance<T>() * 1e4);
  EXPECT_EQ(y[7], -std::numeric_limits<T>::infinity());
  // One element per row: probability 1, log-probability 0.
  const std::vector<T> single = {T(-7), T(42)};
  std::vector<T> out(2);
  softmax_cpu(SoftmaxKind::Softmax, dtype_of<T>(), 2, 1, 1, single.data(), out.data());
  EXPECT_EQ(out, (std::vector<T>{T(1), T(1)}));
  softmax_cpu(SoftmaxKind::LogSoftmax, dtype_of<T>(), 2, 1, 1, single.data(), out.data());
  EXPECT_EQ(out, (std::vector<T>{T(0), T(0)}));
}

// Rows of 32 or more take their maximum and sums in lanes (Note [Row sums in lanes]): the maximum in the tail
// after the last whole group of lanes, in a lane other than the first, a NaN in the middle and a row of -inf.
TYPED_TEST(SoftmaxCpu, LongRowsInLanes) {
  using T = TypeParam;
  constexpr int64_t n = 37;
  const T inf = std::numeric_limits<T>::infinity();
  std::vector<T> uniform(n, T(2)), peak(n, T(-3)), nan_row(n, T(1)), minus_inf(n, -inf), y(n);
  peak[36] = T(1000);  // missed by the maximum, exp(1000 - (-3)) would overflow
  nan_row[13] = std::numeric_limits<T>::quiet_NaN();
  softmax_cpu(SoftmaxKind::Softmax, dtype_of<T>(), 1, n, 1, uniform.data(), y.data());
  EXPECT_EQ(y, std::vector<T>(n, T(1) / T(n)));
  softmax_cpu(SoftmaxKind::Softmax, dtype_of<T>(), 1, n, 1, peak.data(), y.data());
  EXPECT_EQ(y[36], T(1));
  EXPECT_EQ(y[35], T(0));
  softmax_cpu(SoftmaxKind::LogSoftmax, dtype_of<T>(), 1, n, 1, peak.data(), y.data());
  EXPECT_EQ(y[36], T(0));
  EXPECT_NEAR(y[0], -1003.0, tolerance<T>() * 1e3);
  for (SoftmaxKind kind : kKinds) {
    softmax_cpu(kind, dtype_of<T>(), 1, n, 1, nan_row.data(), y.data());
    for (int64_t i = 0; i < n; ++i) EXPECT_TRUE(std::isnan(y[i])) << "kind " << int(kind) << " NaN row at " << i;
    softmax_cpu(kind, dtype_of<T>(), 1, n, 1, minus_inf.data(), y.data());
    for (int64_t i = 0; i < n; ++i) EXPECT_TRUE(std::isnan(y[i])) << "kind " << int(kind) << " -inf row at " << i;
  }
}

TYPED_TEST(SoftmaxCpu, InPlace) {
  using T = TypeParam;
  for (SoftmaxKind kind : kKinds) {
    // {2, 300, 1}: float rows long enough for the vector exp, log-softmax's exps in chunks of 256 (Note [Eight
    // exps at once]), while y is x.
    for (const AxisShape& s : {AxisShape{3, 7, 1}, AxisShape{2, 5, 3}, AxisShape{2, 300, 1}}) {
      const int64_t n = s.outer * s.size * s.inner;
      std::vector<T> x = random_vector<T>(n, -3.0, 3.0, 2), y(static_cast<size_t>(n));
      softmax_cpu(kind, dtype_of<T>(), s.outer, s.size, s.inner, x.data(), y.data());
      softmax_cpu(kind, dtype_of<T>(), s.outer, s.size, s.inner, x.data(), x.data());
      EXPECT_EQ(x, y);
    }
  }
}

TYPED_TEST(SoftmaxCpu, BackwardMatchesDoubleReference) {
  using T = TypeParam;
  for (const AxisShape& s : kShapes) {
    const int64_t n = s.outer * s.size * s.inner;
    const std::vector<T> x = random_vector<T>(n, -4.0, 4.0, 3), dy = random_vector<T>(n, -1.0, 1.0, 4);
    for (SoftmaxKind kind : kKinds) {
      std::vector<T> y(static_cast<size_t>(n)), dx(static_cast<size_t>(n));
      softmax_cpu(kind, dtype_of<T>(), s.outer, s.size, s.inner, x.data(), y.data());
      softmax_backward_cpu(kind, dtype_of<T>(), s.outer, s.size, s.inner, y.data(), dy.data(), dx.data());
      const std::vector<double> want = reference_backward(kind, s, std::vector<double>(y.begin(), y.end()),
                                                          std::vector<double>(dy.begin(), dy.end()));
      // |sum| <= size for log-softmax, so its dx rounds relative to the sum's size.
      const double scale = kind == SoftmaxKind::LogSoftmax ? std::max<double>(1.0, std::sqrt(double(s.size))) : 1.0;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(dx[i], want[i], 2 * tolerance<T>() * scale)
            << "kind " << int(kind) << " shape " << s.outer << "," << s.size << "," << s.inner << " at " << i;
      }
      // dx may overwrite dy.
      std::vector<T> dy_inplace = dy;
      softmax_backward_cpu(kind, dtype_of<T>(), s.outer, s.size, s.inner, y.data(), dy_inplace.data(),
                           dy_inplace.data());
      EXPECT_EQ(dy_inplace, dx);
    }
  }
}

// The backward formulas are the gradient of L(x) = sum(dy * f(x)): central differences in float64.
TEST(SoftmaxCpuGradient, BackwardIsTheGradient) {
  const AxisShape s{2, 5, 3};
  const int64_t n = s.outer * s.size * s.inner;
  const std::vector<double> x = random_vector<double>(n, -2.0, 2.0, 5), dy = random_vector<double>(n, -1.0, 1.0, 6);
  for (SoftmaxKind kind : kKinds) {
    auto loss = [&](const std::vector<double>& input) {
      std::vector<double> y(static_cast<size_t>(n));
      softmax_cpu(kind, DType::Float64, s.outer, s.size, s.inner, input.data(), y.data());
      double l = 0;
      for (int64_t i = 0; i < n; ++i) l += dy[i] * y[i];
      return l;
    };
    std::vector<double> y(static_cast<size_t>(n)), dx(static_cast<size_t>(n));
    softmax_cpu(kind, DType::Float64, s.outer, s.size, s.inner, x.data(), y.data());
    softmax_backward_cpu(kind, DType::Float64, s.outer, s.size, s.inner, y.data(), dy.data(), dx.data());
    for (int64_t i = 0; i < n; ++i) {
      const double h = 1e-6;
      std::vector<double> plus = x, minus = x;
      plus[i] += h;
      minus[i] -= h;
      EXPECT_NEAR(dx[i], (loss(plus) - loss(minus)) / (2 * h), 1e-8) << "kind " << int(kind) << " at " << i;
    }
  }
}

TEST(SoftmaxCpuErrors, RejectsBadArguments) {
  float x[4] = {}, y[4] = {};
  EXPECT_THROW(softmax_cpu(SoftmaxKind::Softmax, DType::Float16, 1, 4, 1, x, y), Error);
  EXPECT_THROW(softmax_cpu(SoftmaxKind::Softmax, DType::Float32, 1, -4, 1, x, y), Error);
  EXPECT_THROW(softmax_backward_cpu(SoftmaxKind::LogSoftmax, DType::Int32, 1, 4, 1, x, y, y), Error);
}

}  // namespace
}  // namespace dpe::kernels
