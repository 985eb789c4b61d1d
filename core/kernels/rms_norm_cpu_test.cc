// rms_norm_forward_cpu / rms_norm_backward_cpu against the formulas of rms_norm.h in long double, on shapes
// whose rows and widths straddle the kernel's lanes (8) and dweight's blocks (64 rows); the same bits on one
// and four threads.
#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/kernels/rms_norm.h"
#include "tests/testing/kernel_test_util.h"

namespace dpe::kernels {
namespace {

template <typename T>
class RmsNormCpuTest : public ::testing::Test {};
TYPED_TEST_SUITE(RmsNormCpuTest, FloatTypes);

struct Outputs {
  std::vector<double> y, rstd, dx, dw;
};

template <typename T>
struct Run {
  std::vector<T> y, rstd, dx, dw;
};

// The kernels on (rows, d), with or without a weight.
template <typename T>
Run<T> run(int64_t rows, int64_t d, const std::vector<T>& x, const std::vector<T>* w, const std::vector<T>& dy,
           double eps) {
  Run<T> r{std::vector<T>(rows * d, T(-7)), std::vector<T>(rows, T(-7)), std::vector<T>(rows * d, T(-7)),
           std::vector<T>(d, T(-7))};  // every output overwritten
  const void* wp = w != nullptr ? w->data() : nullptr;
  rms_norm_forward_cpu(dtype_of<T>(), rows, d, x.data(), wp, eps, r.y.data(), r.rstd.data());
  rms_norm_backward_cpu(dtype_of<T>(), rows, d, x.data(), wp, r.rstd.data(), dy.data(), r.dx.data(), r.dw.data());
  return r;
}

// rms_norm.h's formulas in long double.
template <typename T>
Outputs reference(int64_t rows, int64_t d, const std::vector<T>& x, const std::vector<T>* w,
                  const std::vector<T>& dy, double eps) {
  Outputs o{std::vector<double>(rows * d), std::vector<double>(rows), std::vector<double>(rows * d),
            std::vector<double>(d, 0.0)};
  for (int64_t r = 0; r < rows; ++r) {
    long double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += static_cast<long double>(x[r * d + i]) * x[r * d + i];
    const long double rs = 1.0L / std::sqrt(ss / d + eps);
    long double dot = 0;
    for (int64_t i = 0; i < d; ++i) {
      const long double g = static_cast<long double>(dy[r * d + i]) * (w != nullptr ? (*w)[i] : T(1));
      dot += g * x[r * d + i] * rs;
    }
    o.rstd[r] = static_cast<double>(rs);
    for (int64_t i = 0; i < d; ++i) {
      const long double xhat = x[r * d + i] * rs, wi = w != nullptr ? (*w)[i] : T(1);
      const long double g = static_cast<long double>(dy[r * d + i]) * wi;
      o.y[r * d + i] = static_cast<double>(xhat * wi);
      o.dx[r * d + i] = static_cast<double>(rs * (g - xhat * dot / d));
      o.dw[i] += static_cast<double>(dy[r * d + i] * xhat);
    }
  }
  return o;
}

template <typename T>
void expect_near(const std::vector<T>& got, const std::vector<double>& want, double tolerance, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t k = 0; k < got.size(); ++k) {
    EXPECT_NEAR(static_cast<double>(got[k]), want[k], tolerance * (1.0 + std::abs(want[k]))) << what << "[" << k << "]";
  }
}

TYPED_TEST(RmsNormCpuTest, MatchesTheFormulas) {
  using T = TypeParam;
  const double tolerance = sizeof(T) == 4 ? 2e-5 : 1e-12;
  for (int64_t rows : {1, 3, 64, 65, 200}) {
    for (int64_t d : {1, 5, 8, 13, 128}) {
      SCOPED_TRACE(::testing::Message() << "rows " << rows << ", d " << d);
      const std::vector<T> x = random_vector<T>(rows * d, -3, 3, rows * 100 + d);
      const std::vector<T> w = random_vector<T>(d, -2, 2, d + 7), dy = random_vector<T>(rows * d, -1, 1, rows + 3);
      for (const std::vector<T>* weight : {&w, static_cast<const std::vector<T>*>(nullptr)}) {
        const Run<T> got = run(rows, d, x, weight, dy, 1e-6);
        const Outputs want = reference(rows, d, x, weight, dy, 1e-6);
        expect_near(got.y, want.y, tolerance, "y");
        expect_near(got.rstd, want.rstd, tolerance, "rstd");
        expect_near(got.dx, want.dx, tolerance * 10, "dx");
        expect_near(got.dw, want.dw, tolerance * 10 * std::sqrt(static_cast<double>(rows)), "dweight");
      }
    }
  }
}

// Null outputs are not written (a frozen weight, an input that needs no gradient); no rows is no work.
TYPED_TEST(RmsNormCpuTest, WritesOnlyTheGradientsAskedFor) {
  using T = TypeParam;
  const int64_t rows = 70, d = 9;
  const std::vector<T> x = random_vector<T>(rows * d, -3, 3, 1), w = random_vector<T>(d, -2, 2, 2);
  const std::vector<T> dy = random_vector<T>(rows * d, -1, 1, 3);
  const Run<T> both = run(rows, d, x, &w, dy, 1e-5);
  std::vector<T> dx(rows * d, T(-7)), dw(d, T(-7));
  rms_norm_backward_cpu(dtype_of<T>(), rows, d, x.data(), w.data(), both.rstd.data(), dy.data(), dx.data(), nullptr);
  EXPECT_EQ(dx, both.dx);
  rms_norm_backward_cpu(dtype_of<T>(), rows, d, x.data(), w.data(), both.rstd.data(), dy.data(), nullptr, dw.data());
  EXPECT_EQ(dw, both.dw);
  std::vector<T> empty_dw(d, T(-7));
  rms_norm_backward_cpu(dtype_of<T>(), 0, d, nullptr, w.data(), nullptr, nullptr, nullptr, empty_dw.data());
  EXPECT_EQ(empty_dw, std::vector<T>(d, T(0)));
}

// dweight's blocks are fixed, so the bits do not depend on how many threads run them.
TYPED_TEST(RmsNormCpuTest, SameBitsOnOneAndFourThreads) {
  using T = TypeParam;
  const int64_t rows = 1000, d = 128;
  const std::vector<T> x = random_vector<T>(rows * d, -3, 3, 4), w = random_vector<T>(d, -2, 2, 5);
  const std::vector<T> dy = random_vector<T>(rows * d, -1, 1, 6);
  Run<T> one, four;
  tbb::task_arena(1).execute([&] { one = run(rows, d, x, &w, dy, 1e-6); });
  tbb::task_arena(4).execute([&] { four = run(rows, d, x, &w, dy, 1e-6); });
  EXPECT_EQ(one.y, four.y);
  EXPECT_EQ(one.dx, four.dx);
  EXPECT_EQ(one.dw, four.dw);
}

TEST(RmsNormCpuErrors, NamesTheShape) {
  float x = 1, y, r;
  try {
    rms_norm_forward_cpu(DType::Float32, 1, 0, &x, nullptr, 1e-6, &y, &r);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rms_norm_forward_cpu: rows = 1, d = 0; expected rows >= 0 and d > 0"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dpe::kernels
