// The batch-norm passes (core/kernels/batch_norm.h) against the textbook formulas evaluated in long double
// over (N, C, S), for (N, C) and (N, C, S) shapes, with and without weight and bias; statistics of values far
// from zero (no E[x^2] - E[x]^2 cancellation); aliasing; results independent of the thread count; errors.
#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/kernels/batch_norm.h"
#include "tests/testing/kernel_test_util.h"

namespace dpe::kernels {
namespace {

template <typename T>
class BatchNormCpuTest : public ::testing::Test {};
TYPED_TEST_SUITE(BatchNormCpuTest, FloatTypes);

template <typename T>
constexpr double kTol = std::is_same_v<T, float> ? 2e-5 : 1e-12;

// What the four passes should compute, from the definitions, in long double.
struct Reference {
  std::vector<long double> mean, var, y, sum_dy, sum_dy_xmu, dx_batch, dx_running;
};

template <typename T>
Reference reference(const BatchNormShape& s, const std::vector<T>& x, const std::vector<T>& dy, const T* w,
                    const T* b, const std::vector<T>& invstd) {
  Reference r;
  const long double m = static_cast<long double>(s.n * s.s);
  auto at = [&](int64_t n, int64_t c, int64_t i) { return (n * s.c + c) * s.s + i; };
  r.y.resize(x.size());
  r.dx_batch.resize(x.size());
  r.dx_running.resize(x.size());
  for (int64_t c = 0; c < s.c; ++c) {
    long double sum = 0, sq = 0, g = 0, gx = 0;
    for (int64_t n = 0; n < s.n; ++n) {
      for (int64_t i = 0; i < s.s; ++i) sum += x[at(n, c, i)];
    }
    const long double mean = sum / m;
    for (int64_t n = 0; n < s.n; ++n) {
      for (int64_t i = 0; i < s.s; ++i) {
        const long double d = x[at(n, c, i)] - mean;
        sq += d * d;
        g += dy[at(n, c, i)];
        gx += dy[at(n, c, i)] * d;
      }
    }
    r.mean.push_back(mean);
    r.var.push_back(sq / m);
    r.sum_dy.push_back(g);
    r.sum_dy_xmu.push_back(gx);
    const long double inv = invstd[c], wc = w ? w[c] : 1, bc = b ? b[c] : 0;
    for (int64_t n = 0; n < s.n; ++n) {
      for (int64_t i = 0; i < s.s; ++i) {
        const int64_t k = at(n, c, i);
        const long double xhat = (x[k] - mean) * inv;
        r.y[k] = xhat * wc + bc;
        r.dx_batch[k] = (dy[k] - g / m - xhat * inv * gx / m) * inv * wc;
        r.dx_running[k] = dy[k] * inv * wc;
      }
    }
  }
  return r;
}

// max |got - want| <= tol * max(1, max |want|)
template <typename T>
void expect_close(const std::vector<T>& got, const std::vector<long double>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  long double scale = 1, err = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    scale = std::max(scale, std::abs(want[i]));
    err = std::max(err, std::abs(static_cast<long double>(got[i]) - want[i]));
  }
  EXPECT_LE(static_cast<double>(err), tol * static_cast<double>(scale)) << what;
}

TYPED_TEST(BatchNormCpuTest, FourPassesMatchTheDefinitions) {
  using T = TypeParam;
  for (const BatchNormShape& base : {BatchNormShape{{}, 7, 3, 1}, BatchNormShape{{}, 3, 4, 10}, BatchNormShape{{}, 1, 2, 50}}) {
    BatchNormShape s = base;
    s.dtype = dtype_of<T>();
    SCOPED_TRACE(::testing::Message() << "N " << s.n << " C " << s.c << " S " << s.s);
    const int64_t total = s.n * s.c * s.s;
    // Values around 1000 with spread ~1: a variance from E[x^2] - E[x]^2 would lose it in float32.
    std::vector<T> x = random_vector<T>(total, 999, 1001, 3), dy = random_vector<T>(total, -1, 1, 4);
    const std::vector<T> w = random_vector<T>(s.c, 0.5, 2, 5), b = random_vector<T>(s.c, -1, 1, 6);
    std::vector<T> mean(s.c), var(s.c);
    batch_norm_stats_cpu(s, x.data(), mean.data(), var.data());
    std::vector<T> invstd(s.c);
    for (int64_t c = 0; c < s.c; ++c) invstd[c] = T(1) / std::sqrt(var[c] + T(1e-5));
    for (bool affine : {true, false}) {
      const Reference r = reference(s, x, dy, affine ? w.data() : nullptr, affine ? b.data() : nullptr, invstd);
      expect_close(mean, r.mean, std::numeric_limits<T>::epsilon(), "mean");  // one rounding of ~1000
      expect_close(var, r.var, kTol<T>, "var");
      std::vector<T> y(total), sum_dy(s.c), sum_dy_xmu(s.c), dx(total), dx_running(total);
      batch_norm_elemt_cpu(s, x.data(), mean.data(), invstd.data(), affine ? w.data() : nullptr,
                           affine ? b.data() : nullptr, y.data());
      expect_close(y, r.y, 50 * kTol<T>, "y");  // x - mean loses the digits of 1000 in float32
      batch_norm_backward_reduce_cpu(s, dy.data(), x.data(), mean.data(), sum_dy.data(), sum_dy_xmu.data());
      expect_close(sum_dy, r.sum_dy, kTol<T>, "sum_dy");
      expect_close(sum_dy_xmu, r.sum_dy_xmu, 50 * kTol<T>, "sum_dy_xmu");
      batch_norm_backward_elemt_cpu(s, true, dy.data(), x.data(), mean.data(), invstd.data(),
                                    affine ? w.data() : nullptr, sum_dy.data(), sum_dy_xmu.data(), dx.data());
      expect_close(dx, r.dx_batch, 50 * kTol<T>, "dx (batch statistics)");
      batch_norm_backward_elemt_cpu(s, false, dy.data(), nullptr, nullptr, invstd.data(), affine ? w.data() : nullptr,
                                    nullptr, nullptr, dx_running.data());
      expect_close(dx_running, r.dx_running, kTol<T>, "dx (running statistics)");
    }
  }
}

TEST(BatchNormCpuTest, InPlaceAndThreadCountIndependent) {
  const BatchNormShape s{DType::Float32, 64, 8, 300};  // enough work for several TBB chunks
  const int64_t total = s.n * s.c * s.s;
  const std::vector<float> x = random_vector<float>(total, -3, 5, 7), dy = random_vector<float>(total, -1, 1, 8);
  auto run = [&](int threads) {
    std::vector<float> mean(s.c), var(s.c), invstd(s.c, 0.7f), g(s.c), gx(s.c);
    std::vector<float> y = x, dx = dy;  // y aliases x, dx aliases dy
    tbb::task_arena(threads).execute([&] {
      batch_norm_stats_cpu(s, x.data(), mean.data(), var.data());
      batch_norm_elemt_cpu(s, y.data(), mean.data(), invstd.data(), nullptr, nullptr, y.data());
      batch_norm_backward_reduce_cpu(s, dy.data(), x.data(), mean.data(), g.data(), gx.data());
      batch_norm_backward_elemt_cpu(s, true, dx.data(), x.data(), mean.data(), invstd.data(), nullptr, g.data(),
                                    gx.data(), dx.data());
    });
    std::vector<float> all = mean;
    for (const auto* v : {&var, &g, &gx, &y, &dx}) all.insert(all.end(), v->begin(), v->end());
    return all;
  };
  const std::vector<float> one = run(1);
  EXPECT_EQ(run(2), one);
  EXPECT_EQ(run(4), one);
  // In place equals out of place.
  std::vector<float> mean(s.c), var(s.c), invstd(s.c, 0.7f), y(total);
  batch_norm_stats_cpu(s, x.data(), mean.data(), var.data());
  batch_norm_elemt_cpu(s, x.data(), mean.data(), invstd.data(), nullptr, nullptr, y.data());
  EXPECT_TRUE(std::equal(y.begin(), y.end(), one.begin() + 4 * s.c));
}

TEST(BatchNormCpuTest, Errors) {
  std::vector<double> x(4), mean(2), var(2);
  try {
    batch_norm_stats_cpu({DType::Float64, 0, 2, 3}, x.data(), mean.data(), var.data());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch_norm_stats_cpu: no values per channel (N 0, S 3)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(batch_norm_elemt_cpu({DType::Float64, -1, 2, 2}, x.data(), mean.data(), var.data(), nullptr, nullptr,
                                    x.data()),
               Error);
  EXPECT_THROW(batch_norm_stats_cpu({DType::Int64, 1, 2, 2}, x.data(), mean.data(), var.data()), Error);
  // No channels, or an empty batch outside the statistics: nothing to do.
  batch_norm_stats_cpu({DType::Float64, 0, 0, 3}, x.data(), mean.data(), var.data());
  batch_norm_elemt_cpu({DType::Float64, 0, 2, 3}, x.data(), mean.data(), var.data(), nullptr, nullptr, x.data());
}

}  // namespace
}  // namespace dpe::kernels
