// Elementwise CPU kernels against references written out here in double (std:: math, finite
// differences), for float32 and float64, odd sizes, the parallel path and every broadcasting pattern.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/kernels/elementwise.h"
#include "core/kernels/vector_exp.h"
#include "tests/testing/kernel_test_util.h"

namespace dpe::kernels {
namespace {

// Relative tolerance of one library-math op in T against the double reference: float32's libm
// functions (expf, erff, tanhf) are within a few ulps; float64 within a couple.
template <typename T>
double tolerance() {
  return std::is_same_v<T, float> ? 4e-6 : 1e-14;
}

const int64_t kSizes[] = {0, 1, 7, 1023, 100003};  // 100003 takes the parallel path

double reference_unary(UnaryOp op, double x) {
  switch (op) {
    case UnaryOp::Neg: return -x;
    case UnaryOp::Exp: return std::exp(x);
    case UnaryOp::Log: return std::log(x);
    case UnaryOp::Sqrt: return std::sqrt(x);
    case UnaryOp::Rsqrt: return 1 / std::sqrt(x);
    case UnaryOp::Abs: return std::fabs(x);
    case UnaryOp::Square: return x * x;
    case UnaryOp::Reciprocal: return 1 / x;
    case UnaryOp::Relu: return std::max(x, 0.0);
    case UnaryOp::Gelu: return x * 0.5 * std::erfc(-x / std::sqrt(2.0));
    case UnaryOp::Silu: return x / (1 + std::exp(-x));
    case UnaryOp::Tanh: return std::tanh(x);
    case UnaryOp::Sigmoid: return 1 / (1 + std::exp(-x));
  }
  return 0;
}

// Ops whose float result is exactly the double result rounded (or exact): compared with ==.
bool is_exact(UnaryOp op) {
  return op == UnaryOp::Neg || op == UnaryOp::Abs || op == UnaryOp::Relu || op == UnaryOp::Square ||
         op == UnaryOp::Sqrt || op == UnaryOp::Reciprocal;
}

const UnaryOp kUnaryOps[] = {UnaryOp::Neg,    UnaryOp::Exp,        UnaryOp::Log,  UnaryOp::Sqrt, UnaryOp::Rsqrt,
                             UnaryOp::Abs,    UnaryOp::Square,     UnaryOp::Reciprocal, UnaryOp::Relu,
                             UnaryOp::Gelu,   UnaryOp::Silu,       UnaryOp::Tanh, UnaryOp::Sigmoid};
const ActivationOp kActivations[] = {ActivationOp::Relu, ActivationOp::Gelu, ActivationOp::Silu, ActivationOp::Tanh,
                                     ActivationOp::Sigmoid};
const BinaryOp kBinaryOps[] = {BinaryOp::Add, BinaryOp::Sub,     BinaryOp::Mul,
                               BinaryOp::Div, BinaryOp::Maximum, BinaryOp::Minimum};

UnaryOp as_unary(ActivationOp op) {
  switch (op) {
    case ActivationOp::Relu: return UnaryOp::Relu;
    case ActivationOp::Gelu: return UnaryOp::Gelu;
    case ActivationOp::Silu: return UnaryOp::Silu;
    case ActivationOp::Tanh: return UnaryOp::Tanh;
    case ActivationOp::Sigmoid: return UnaryOp::Sigmoid;
  }
  return UnaryOp::Neg;
}

template <typename T>
T reference_binary(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::Add: return a + b;
    case BinaryOp::Sub: return a - b;
    case BinaryOp::Mul: return a * b;
    case BinaryOp::Div: return a / b;
    case BinaryOp::Maximum: return std::isnan(a) || a > b ? a : b;
    case BinaryOp::Minimum: return std::isnan(a) || a < b ? a : b;
  }
  return 0;
}

template <typename T>
class ElementwiseCpu : public ::testing::Test {};
TYPED_TEST_SUITE(ElementwiseCpu, FloatTypes);

TYPED_TEST(ElementwiseCpu, UnaryMatchesDoubleReference) {
  using T = TypeParam;
  for (UnaryOp op : kUnaryOps) {
    const bool positive = op == UnaryOp::Log || op == UnaryOp::Sqrt || op == UnaryOp::Rsqrt;
    for (int64_t n : kSizes) {
      const std::vector<T> x = random_vector<T>(n, positive ? 0.05 : -4.0, 4.0, 7);
      std::vector<T> y(x.size() + 1, T(-123));
      unary_cpu(op, dtype_of<T>(), n, x.data(), y.data());
      for (int64_t i = 0; i < n; ++i) {
        const double want = reference_unary(op, x[i]);
        if (is_exact(op)) {
          ASSERT_EQ(y[i], static_cast<T>(want)) << "op " << int(op) << " x " << x[i];
        } else {
          ASSERT_NEAR(y[i], want, tolerance<T>() * std::max(1.0, std::fabs(want))) << "op " << int(op) << " x " << x[i];
        }
      }
      EXPECT_EQ(y[n], T(-123)) << "wrote past n";
    }
  }
}

TYPED_TEST(ElementwiseCpu, UnaryInPlaceAndSpecialValues) {
  using T = TypeParam;
  const T inf = std::numeric_limits<T>::infinity();
  const T nan = std::numeric_limits<T>::quiet_NaN();
  std::vector<T> x = {T(-2), T(0), T(3), -inf, inf, nan};
  unary_cpu(UnaryOp::Relu, dtype_of<T>(), 6, x.data(), x.data());
  EXPECT_EQ(std::vector<T>(x.begin(), x.end() - 1), (std::vector<T>{T(0), T(0), T(3), T(0), inf}));
  EXPECT_TRUE(std::isnan(x[5])) << "relu(NaN) is NaN in PyTorch (a NaN activation must not be hidden), got " << x[5];
  std::vector<T> e = {-inf, T(0), inf};
  unary_cpu(UnaryOp::Exp, dtype_of<T>(), 3, e.data(), e.data());
  EXPECT_EQ(e, (std::vector<T>{T(0), T(1), inf}));
  std::vector<T> s = {T(-100), T(100)};
  unary_cpu(UnaryOp::Sigmoid, dtype_of<T>(), 2, s.data(), s.data());
  EXPECT_NEAR(s[0], 0, 1e-30);
  EXPECT_EQ(s[1], T(1));
}

TYPED_TEST(ElementwiseCpu, ActivationBackwardMatchesFiniteDifferences) {
  using T = TypeParam;
  for (ActivationOp op : kActivations) {
    for (int64_t n : kSizes) {
      // Keep x away from ReLU's kink at 0 so the central difference is valid.
      std::vector<T> x = random_vector<T>(n, -4.0, 4.0, 11);
      for (auto& v : x) {
        if (std::fabs(v) < 1e-2) v = T(0.5);
      }
      const std::vector<T> dy = random_vector<T>(n, -2.0, 2.0, 12);
      std::vector<T> dx(x.size());
      activation_backward_cpu(op, dtype_of<T>(), n, x.data(), dy.data(), dx.data());
      for (int64_t i = 0; i < n; ++i) {
        const double h = 1e-5, xi = x[i];
        const double derivative =
            (reference_unary(as_unary(op), xi + h) - reference_unary(as_unary(op), xi - h)) / (2 * h);
        const double want = dy[i] * derivative;
        // Central differences are accurate to ~h^2 * f''' plus rounding 1e-16 / h.
        ASSERT_NEAR(dx[i], want, 1e-8 + tolerance<T>() * 4 * std::fabs(dy[i])) << "op " << int(op) << " x " << xi;
      }
    }
  }
}

TYPED_TEST(ElementwiseCpu, ActivationBackwardExactValues) {
  using T = TypeParam;
  const std::vector<T> x = {T(-1), T(0), T(2)}, dy = {T(5), T(5), T(5)};
  std::vector<T> dx(3);
  activation_backward_cpu(ActivationOp::Relu, dtype_of<T>(), 3, x.data(), dy.data(), dx.data());
  EXPECT_EQ(dx, (std::vector<T>{T(0), T(0), T(5)}));  // ReLU'(0) = 0, like PyTorch
  // PyTorch's threshold_backward: 0 wherever x <= 0 whatever dy is (not dy * 0, which is NaN for inf or NaN).
  const std::vector<T> bad_dy = {std::numeric_limits<T>::infinity(), std::numeric_limits<T>::quiet_NaN(), T(5)};
  activation_backward_cpu(ActivationOp::Relu, dtype_of<T>(), 3, x.data(), bad_dy.data(), dx.data());
  EXPECT_EQ(dx, (std::vector<T>{T(0), T(0), T(5)}));
  // At a NaN input the gradient passes (PyTorch: x <= 0 is false for NaN).
  const std::vector<T> nan_x = {std::numeric_limits<T>::quiet_NaN()}, one_dy = {T(3)};
  std::vector<T> nan_dx(1);
  activation_backward_cpu(ActivationOp::Relu, dtype_of<T>(), 1, nan_x.data(), one_dy.data(), nan_dx.data());
  EXPECT_EQ(nan_dx[0], T(3));
  activation_backward_cpu(ActivationOp::Tanh, dtype_of<T>(), 3, x.data(), dy.data(), dx.data());
  EXPECT_EQ(dx[1], T(5));
  activation_backward_cpu(ActivationOp::Sigmoid, dtype_of<T>(), 3, x.data(), dy.data(), dx.data());
  EXPECT_EQ(dx[1], T(1.25));
  activation_backward_cpu(ActivationOp::Gelu, dtype_of<T>(), 3, x.data(), dy.data(), dx.data());
  EXPECT_EQ(dx[1], T(2.5));
}

// Strides of a broadcast operand stored contiguously with `stored` sizes (1 where broadcast).
Layout broadcast(std::vector<int64_t> stored, std::vector<int64_t> out_sizes) {
  Layout l = contiguous(stored);
  for (int d = 0; d < l.ndim; ++d) {
    if (stored[d] == 1) l.strides[d] = 0;
    l.sizes[d] = out_sizes[d];
  }
  return l;
}

// Runs every binary op on (a_layout, b_layout) -> contiguous out and compares with the same scalar op in
// T at the offsets offset_of gives: exact, since one IEEE operation rounds the same everywhere.
template <typename T>
void check_binary(const Layout& a_layout, const Layout& b_layout) {
  const Layout out_layout = contiguous(std::vector<int64_t>(a_layout.sizes, a_layout.sizes + a_layout.ndim));
  const int64_t n = out_layout.numel();
  const std::vector<T> a = random_vector<T>(extent(a_layout), -3.0, 3.0, 21);
  std::vector<T> b = random_vector<T>(extent(b_layout), 0.5, 3.0, 22);
  for (size_t i = 0; i < b.size(); i += 2) b[i] = -b[i];  // both signs, never 0 (Div)
  for (BinaryOp op : kBinaryOps) {
    std::vector<T> out(static_cast<size_t>(n) + 1, T(-77));
    binary_cpu(op, dtype_of<T>(), out_layout, a.data(), a_layout, b.data(), b_layout, out.data());
    int64_t mismatches = 0;
    for (int64_t i = 0; i < n; ++i) {
      const T want = reference_binary(op, a[a_layout.offset_of(i)], b[b_layout.offset_of(i)]);
      if (out[i] != want && ++mismatches <= 3) {
        ADD_FAILURE() << "op " << int(op) << " element " << i << ": want " << want << " got " << out[i];
      }
    }
    EXPECT_EQ(mismatches, 0) << "op " << int(op);
    EXPECT_EQ(out[n], T(-77)) << "wrote past the end";
  }
}

TYPED_TEST(ElementwiseCpu, BinarySameShape) {
  for (int64_t n : kSizes) check_binary<TypeParam>(contiguous({n}), contiguous({n}));
  check_binary<TypeParam>(contiguous({3, 0, 4}), contiguous({3, 0, 4}));
  check_binary<TypeParam>(contiguous({5, 7, 3}), contiguous({5, 7, 3}));
}

TYPED_TEST(ElementwiseCpu, BinaryRowVectorBroadcast) {
  check_binary<TypeParam>(contiguous({7, 5}), broadcast({1, 5}, {7, 5}));     // bias add
  check_binary<TypeParam>(broadcast({1, 5}, {7, 5}), contiguous({7, 5}));
  check_binary<TypeParam>(contiguous({400, 333}), broadcast({1, 333}, {400, 333}));  // parallel path
  check_binary<TypeParam>(contiguous({4, 6, 1023}), broadcast({1, 1, 1023}, {4, 6, 1023}));
}

TYPED_TEST(ElementwiseCpu, BinaryScalarAndColumnBroadcast) {
  check_binary<TypeParam>(contiguous({1023}), broadcast({1}, {1023}));
  check_binary<TypeParam>(broadcast({1, 1}, {9, 7}), contiguous({9, 7}));
  check_binary<TypeParam>(contiguous({100003}), broadcast({1}, {100003}));
  check_binary<TypeParam>(contiguous({9, 7}), broadcast({9, 1}, {9, 7}));
  check_binary<TypeParam>(broadcast({300, 1}, {300, 400}), contiguous({300, 400}));
}

TYPED_TEST(ElementwiseCpu, BinaryMixedBroadcastAndStrides) {
  check_binary<TypeParam>(broadcast({9, 1}, {9, 7}), broadcast({1, 7}, {9, 7}));  // outer product
  check_binary<TypeParam>(contiguous({4, 5, 6}), broadcast({4, 1, 6}, {4, 5, 6}));  // middle dim
  check_binary<TypeParam>(make_layout({5, 3}, {1, 5}), contiguous({5, 3}));          // transposed a
  check_binary<TypeParam>(make_layout({300, 257}, {1, 300}), broadcast({1, 257}, {300, 257}));
  check_binary<TypeParam>(make_layout({2, 3, 4, 5, 1, 2}, {1, 2, 6, 24, 0, 120}),
                          broadcast({2, 1, 4, 1, 1, 2}, {2, 3, 4, 5, 1, 2}));
}

TYPED_TEST(ElementwiseCpu, BinaryOutputMayAliasInput) {
  using T = TypeParam;
  std::vector<T> a = {T(1), T(2), T(3), T(4), T(5), T(6)};
  const std::vector<T> b = {T(10), T(20), T(30)};
  binary_cpu(BinaryOp::Add, dtype_of<T>(), contiguous({2, 3}), a.data(), contiguous({2, 3}), b.data(),
             broadcast({1, 3}, {2, 3}), a.data());
  EXPECT_EQ(a, (std::vector<T>{T(11), T(22), T(33), T(14), T(25), T(36)}));
}

TYPED_TEST(ElementwiseCpu, MaximumAndMinimumPropagateNaN) {
  using T = TypeParam;
  const T nan = std::numeric_limits<T>::quiet_NaN();
  const std::vector<T> a = {T(1), nan, T(2)}, b = {nan, T(1), T(-2)};
  std::vector<T> out(3);
  binary_cpu(BinaryOp::Maximum, dtype_of<T>(), contiguous({3}), a.data(), contiguous({3}), b.data(), contiguous({3}),
             out.data());
  // A NaN on either side propagates, like torch.maximum.
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_EQ(out[2], T(2));
  binary_cpu(BinaryOp::Minimum, dtype_of<T>(), contiguous({3}), a.data(), contiguous({3}), b.data(), contiguous({3}),
             out.data());
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_EQ(out[2], T(-2));
}

TYPED_TEST(ElementwiseCpu, AffineAndAxpyExact) {
  using T = TypeParam;
  for (int64_t n : kSizes) {
    std::vector<T> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[i] = T(i % 1000) * T(0.25) - T(100);
    affine_cpu(dtype_of<T>(), n, x.data(), 2.0, 0.5, y.data());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], 2 * x[i] + T(0.5)) << i;
    axpy_cpu(dtype_of<T>(), n, -0.5, x.data(), y.data());  // y = 1.5 x + 0.5
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], T(1.5) * x[i] + T(0.5)) << i;
    affine_cpu(dtype_of<T>(), n, y.data(), -1.0, 0.0, y.data());  // in place negate
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], -(T(1.5) * x[i] + T(0.5))) << i;
  }
}

TEST(ElementwiseCpuErrors, RejectsBadArguments) {
  float x[4] = {}, y[4] = {};
  EXPECT_THROW(unary_cpu(UnaryOp::Exp, DType::Int32, 4, x, y), Error);
  EXPECT_THROW(unary_cpu(UnaryOp::Exp, DType::Float32, -1, x, y), Error);
  EXPECT_THROW(affine_cpu(DType::Float16, 4, x, 1, 0, y), Error);
  EXPECT_THROW(binary_cpu(BinaryOp::Add, DType::Float32, contiguous({4}), x, contiguous({2}), y, contiguous({4}), y),
               Error);
  EXPECT_THROW(binary_cpu(BinaryOp::Add, DType::Float32, make_layout({2, 2}, {1, 2}), x, contiguous({2, 2}), y,
                          contiguous({2, 2}), y),
               Error);  // out not contiguous
}

// silu_mul and its backward give every element the bits of the composition they replace (unary_cpu's SiLU, then
// binary_cpu's mul; binary_cpu's mul, then activation_backward_cpu's SiLU), on the vector body, the padded last
// group and both sides of a parallel split; a null output is not written.
TYPED_TEST(ElementwiseCpu, SiluMulIsTheComposition) {
  using T = TypeParam;
  for (int64_t n : kSizes) {
    SCOPED_TRACE(n);
    const std::vector<T> gate = random_vector<T>(n, -12.0, 12.0, 31), up = random_vector<T>(n, -3.0, 3.0, 32),
                         dy = random_vector<T>(n, -2.0, 2.0, 33);
    const Layout flat = contiguous({n});
    std::vector<T> silu(n), y(n), want_y(n), dy_up(n), want_dgate(n), want_dup(n), dgate(n), dup(n, T(-7));
    unary_cpu(UnaryOp::Silu, dtype_of<T>(), n, gate.data(), silu.data());
    binary_cpu(BinaryOp::Mul, dtype_of<T>(), flat, silu.data(), flat, up.data(), flat, want_y.data());
    binary_cpu(BinaryOp::Mul, dtype_of<T>(), flat, dy.data(), flat, up.data(), flat, dy_up.data());
    activation_backward_cpu(ActivationOp::Silu, dtype_of<T>(), n, gate.data(), dy_up.data(), want_dgate.data());
    binary_cpu(BinaryOp::Mul, dtype_of<T>(), flat, dy.data(), flat, silu.data(), flat, want_dup.data());

    silu_mul_cpu(dtype_of<T>(), n, gate.data(), up.data(), y.data());
    EXPECT_EQ(y, want_y);
    silu_mul_backward_cpu(dtype_of<T>(), n, gate.data(), up.data(), dy.data(), dgate.data(), nullptr);
    EXPECT_EQ(dgate, want_dgate);
    EXPECT_EQ(dup, std::vector<T>(n, T(-7)));
    silu_mul_backward_cpu(dtype_of<T>(), n, gate.data(), up.data(), dy.data(), nullptr, dup.data());
    EXPECT_EQ(dup, want_dup);
  }
}

// Note [Eight exps at once]: float32 SiLU and sigmoid, forward and backward, give an element the same bits
// wherever it sits in the array (in a group of 8, in the padded last group, on either side of a parallel split),
// and special values what math.h's formula gives them.
TEST(ElementwiseCpuVectorExp, AnElementsBitsDoNotDependOnItsPlace) {
  const int64_t n = 100003;  // the parallel path, and a last group of 3
  const std::vector<float> x = random_vector<float>(n, -12.0, 12.0, 21), dy = random_vector<float>(n, -2.0, 2.0, 22);
  for (UnaryOp op : {UnaryOp::Silu, UnaryOp::Sigmoid}) {
    std::vector<float> whole(n);
    unary_cpu(op, DType::Float32, n, x.data(), whole.data());
    for (int64_t offset : {1, 3, 8, 13}) {
      std::vector<float> shifted(n - offset);
      unary_cpu(op, DType::Float32, n - offset, x.data() + offset, shifted.data());
      for (int64_t i = 0; i < n - offset; ++i) {
        ASSERT_EQ(shifted[i], whole[i + offset]) << "op " << int(op) << " offset " << offset << " x " << x[i + offset];
      }
    }
  }
  for (ActivationOp op : {ActivationOp::Silu, ActivationOp::Sigmoid}) {
    std::vector<float> whole(n);
    activation_backward_cpu(op, DType::Float32, n, x.data(), dy.data(), whole.data());
    for (int64_t offset : {1, 5, 8}) {
      std::vector<float> shifted(n - offset);
      activation_backward_cpu(op, DType::Float32, n - offset, x.data() + offset, dy.data() + offset, shifted.data());
      for (int64_t i = 0; i < n - offset; ++i) {
        ASSERT_EQ(shifted[i], whole[i + offset]) << "op " << int(op) << " offset " << offset << " x " << x[i + offset];
      }
    }
  }
}

TEST(ElementwiseCpuVectorExp, SpecialValuesAsTheScalarFormula) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x = {-inf, inf, nan, -0.0f, 0.0f, -100.0f, 100.0f, -88.8f, 88.8f, -104.0f, 1e-30f};
  auto same = [](float got, float want) { return (std::isnan(got) && std::isnan(want)) || got == want; };
  std::vector<float> silu(x.size()), sigmoid(x.size()), d_silu(x.size()), dy(x.size(), 1.0f);
  unary_cpu(UnaryOp::Silu, DType::Float32, static_cast<int64_t>(x.size()), x.data(), silu.data());
  unary_cpu(UnaryOp::Sigmoid, DType::Float32, static_cast<int64_t>(x.size()), x.data(), sigmoid.data());
  activation_backward_cpu(ActivationOp::Silu, DType::Float32, static_cast<int64_t>(x.size()), x.data(), dy.data(),
                          d_silu.data());
  for (size_t i = 0; i < x.size(); ++i) {
    // At these values expf is exact or saturates (0, 1, inf), so the formula's bits are determined.
    const float s = 1.0f / (1.0f + std::exp(-x[i]));
    EXPECT_TRUE(same(sigmoid[i], s)) << "sigmoid(" << x[i] << ") = " << sigmoid[i] << ", want " << s;
    EXPECT_TRUE(same(silu[i], x[i] * s)) << "silu(" << x[i] << ") = " << silu[i] << ", want " << x[i] * s;
    const float slope = s * (1.0f + x[i] * (1.0f - s));
    EXPECT_TRUE(same(d_silu[i], slope)) << "silu'(" << x[i] << ") = " << d_silu[i] << ", want " << slope;
  }
}

#if defined(__AVX2__)
// Note [Lanes libmvec sends to the scalar expf]: exp8 answers the lanes beyond its thresholds itself, with the
// scalar expf's bits, whatever the other lanes of the vector hold; NaN and the values in between go to libmvec.
TEST(ElementwiseCpuVectorExp, OutOfRangeLanesAsTheScalarExp) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x = {-inf, -1e30f, -200.0f, -104.5f, std::nextafter(detail::kExpZeroBelow, -inf),
                                detail::kExpZeroBelow, -103.98f, -103.9f, -100.0f, -87.5f, -87.0f, -1.0f, 0.0f,
                                -0.0f, 1.0f, 87.0f, 88.7f, 88.75f, detail::kExpInfAbove,
                                std::nextafter(detail::kExpInfAbove, inf), 100.0f, 1e30f, inf, nan};
  for (size_t first = 0; first < x.size(); ++first) {
    alignas(32) float in[8], out[8];
    for (int j = 0; j < 8; ++j) in[j] = x[(first + static_cast<size_t>(j)) % x.size()];  // every neighbour mix
    _mm256_store_ps(out, detail::exp8(_mm256_load_ps(in)));
    for (int j = 0; j < 8; ++j) {
      const float want = std::exp(in[j]);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(out[j])) << "exp8(" << in[j] << ") = " << out[j];
      } else if (in[j] < detail::kExpZeroBelow || in[j] > detail::kExpInfAbove || std::fabs(in[j]) > 87.3f) {
        EXPECT_EQ(out[j], want) << "exp8(" << in[j] << ")";  // exact: answered by exp8 or by the scalar expf
        EXPECT_EQ(std::signbit(out[j]), std::signbit(want)) << "exp8(" << in[j] << ")";
      } else {
        EXPECT_NEAR(out[j], want, 4 * std::numeric_limits<float>::epsilon() * want) << "exp8(" << in[j] << ")";
      }
    }
  }
}
#endif

}  // namespace
}  // namespace dpe::kernels
