// reduce_cpu / argmax_cpu against double references over (outer, size, inner), including the accuracy
// of long float32 sums and independence from the number of threads.
#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/kernels/reduce.h"
#include "tests/testing/kernel_test_util.h"

namespace dpe::kernels {
namespace {

// Odd sizes, inner > kTile (256) with a partial tile, and shapes large enough for every parallel path.
const AxisShape kShapes[] = {{1, 1, 1},     {1, 7, 1},      {3, 7, 1},   {2, 1023, 1}, {2, 1023, 5},
                             {3, 17, 300},  {1, 100003, 1}, {1, 5, 70001}, {4, 3000, 300}, {1, 100000, 3},
                             {70000, 3, 1}, {2, 0, 3},      {0, 5, 2},     {2, 5, 0}};

const AxisReduction kOps[] = {AxisReduction::Sum, AxisReduction::Mean, AxisReduction::Max, AxisReduction::Min};

// y, and sum |x| along the axis (the scale of a sum's rounding error). Accumulates in long double.
std::vector<double> reference(AxisReduction op, const AxisShape& s, const double* x,
                              std::vector<double>* abs_sum = nullptr) {
  std::vector<double> y(static_cast<size_t>(s.outer * s.inner));
  if (abs_sum) abs_sum->assign(y.size(), 0.0);
  for (int64_t o = 0; o < s.outer; ++o) {
    for (int64_t i = 0; i < s.inner; ++i) {
      long double acc = op == AxisReduction::Max ? -INFINITY : op == AxisReduction::Min ? INFINITY : 0.0;
      long double abs_acc = 0;
      for (int64_t k = 0; k < s.size; ++k) {
        const long double v = x[(o * s.size + k) * s.inner + i];
        acc = op == AxisReduction::Max ? std::max(acc, v) : op == AxisReduction::Min ? std::min(acc, v) : acc + v;
        abs_acc += std::fabs(v);
      }
      y[o * s.inner + i] = static_cast<double>(op == AxisReduction::Mean ? acc / s.size : acc);
      if (abs_sum) (*abs_sum)[o * s.inner + i] = static_cast<double>(op == AxisReduction::Mean ? abs_acc / s.size : abs_acc);
    }
  }
  return y;
}

template <typename T>
class ReduceCpu : public ::testing::Test {};
TYPED_TEST_SUITE(ReduceCpu, FloatTypes);

TYPED_TEST(ReduceCpu, MatchesDoubleReference) {
  using T = TypeParam;
  for (const AxisShape& s : kShapes) {
    const int64_t n = s.outer * s.size * s.inner;
    const std::vector<T> x = random_vector<T>(n, -1.0, 1.0, 3);
    const std::vector<double> xd(x.begin(), x.end());
    for (AxisReduction op : kOps) {
      if (s.size == 0 && op != AxisReduction::Sum) continue;
      std::vector<T> y(static_cast<size_t>(s.outer * s.inner) + 1, T(-99));
      reduce_cpu(op, dtype_of<T>(), s.outer, s.size, s.inner, x.data(), y.data());
      std::vector<double> scale;
      const std::vector<double> want = reference(op, s, xd.data(), &scale);
      for (size_t i = 0; i < want.size(); ++i) {
        if (op == AxisReduction::Max || op == AxisReduction::Min) {
          ASSERT_EQ(y[i], want[i]) << "op " << int(op) << " shape " << s.outer << "," << s.size << "," << s.inner;
        } else {
          // Worst case (leaf / lanes + log2 size) ulps of sum |x|; random signs stay far below 16.
          const double bound = 16 * std::numeric_limits<T>::epsilon() * scale[i] + 1e-300;
          ASSERT_NEAR(y[i], want[i], bound) << "op " << int(op) << " shape " << s.outer << "," << s.size << ","
                                            << s.inner << " index " << i;
        }
      }
      EXPECT_EQ(y.back(), T(-99)) << "wrote past the output";
    }
  }
}

TYPED_TEST(ReduceCpu, IntegerValuedSumsAreExact) {
  using T = TypeParam;
  for (const AxisShape& s : {AxisShape{3, 1023, 1}, AxisShape{2, 1001, 7}, AxisShape{1, 200003, 1}}) {
    const int64_t n = s.outer * s.size * s.inner;
    std::vector<T> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[i] = T((i * 7919) % 7 - 3);
    std::vector<T> y(static_cast<size_t>(s.outer * s.inner));
    reduce_cpu(AxisReduction::Sum, dtype_of<T>(), s.outer, s.size, s.inner, x.data(), y.data());
    const std::vector<double> want = reference(AxisReduction::Sum, s, std::vector<double>(x.begin(), x.end()).data());
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], T(want[i])) << i;
  }
}

TEST(ReduceCpuAccuracy, Float32SumOfAMillionStaysAccurate) {
  // A naive float32 loop over 1e6 copies of 0.1f is off by ~1%; pairwise summation by a few ulps.
  const int64_t n = 1000000;
  std::vector<float> x(n, 0.1f);
  float sum = 0, mean = 0;
  reduce_cpu(AxisReduction::Sum, DType::Float32, 1, n, 1, x.data(), &sum);
  reduce_cpu(AxisReduction::Mean, DType::Float32, 1, n, 1, x.data(), &mean);
  const double want = n * static_cast<double>(0.1f);
  EXPECT_NEAR(sum, want, 4 * want * std::numeric_limits<float>::epsilon());
  EXPECT_NEAR(mean, 0.1f, 4 * 0.1 * std::numeric_limits<float>::epsilon());

  // Random magnitudes, and the same along a strided axis (inner > 1).
  const std::vector<float> r = random_vector<float>(2 * n, 0.0, 1.0, 5);
  double want_even = 0, want_odd = 0;
  for (int64_t i = 0; i < n; ++i) {
    want_even += r[2 * i];
    want_odd += r[2 * i + 1];
  }
  float strided[2];
  reduce_cpu(AxisReduction::Sum, DType::Float32, 1, n, 2, r.data(), strided);
  EXPECT_NEAR(strided[0], want_even, 1e-6 * want_even);
  EXPECT_NEAR(strided[1], want_odd, 1e-6 * want_odd);
}

TEST(ReduceCpuDeterminism, SameBitsForAnyNumberOfThreads) {
  const std::vector<float> x = random_vector<float>(3 * 400000, -1.0, 1.0, 9);
  auto run = [&](int threads, int64_t outer, int64_t size, int64_t inner) {
    std::vector<float> y(static_cast<size_t>(outer * inner));
    tbb::task_arena arena(threads);
    arena.execute([&] { reduce_cpu(AxisReduction::Sum, DType::Float32, outer, size, inner, x.data(), y.data()); });
    return y;
  };
  for (const AxisShape& s :
       {AxisShape{1, 1200000, 1}, AxisShape{3, 400000, 1}, AxisShape{1, 400000, 3}, AxisShape{2, 600, 1000}}) {
    const std::vector<float> one = run(1, s.outer, s.size, s.inner);
    for (int threads : {2, 3, 8}) {
      const std::vector<float> many = run(threads, s.outer, s.size, s.inner);
      EXPECT_EQ(std::memcmp(one.data(), many.data(), one.size() * sizeof(float)), 0)
          << threads << " threads, shape " << s.outer << "," << s.size << "," << s.inner;
    }
  }
}

TYPED_TEST(ReduceCpu, NaNPropagates) {
  using T = TypeParam;
  const T nan = std::numeric_limits<T>::quiet_NaN();
  for (int64_t pos : {0, 5, 1000}) {
    std::vector<T> x(1001, T(1));
    x[pos] = nan;
    for (AxisReduction op : kOps) {
      T y = 0;
      reduce_cpu(op, dtype_of<T>(), 1, 1001, 1, x.data(), &y);
      EXPECT_TRUE(std::isnan(y)) << "op " << int(op) << " NaN at " << pos;
      T cols[3];
      std::vector<T> xs(3 * 1001, T(2));
      xs[3 * pos + 1] = nan;
      reduce_cpu(op, dtype_of<T>(), 1, 1001, 3, xs.data(), cols);
      EXPECT_FALSE(std::isnan(cols[0]));
      EXPECT_TRUE(std::isnan(cols[1])) << "op " << int(op) << " NaN at " << pos;
    }
  }
}

TYPED_TEST(ReduceCpu, SumOverEmptyAxisIsZero) {
  using T = TypeParam;
  std::vector<T> y(6, T(5));
  reduce_cpu(AxisReduction::Sum, dtype_of<T>(), 2, 0, 3, nullptr, y.data());
  EXPECT_EQ(y, std::vector<T>(6, T(0)));
}

// Reference argmax: first index of the maximum, NaN as the maximum.
std::vector<int64_t> reference_argmax(const AxisShape& s, const double* x) {
  std::vector<int64_t> idx(static_cast<size_t>(s.outer * s.inner));
  for (int64_t o = 0; o < s.outer; ++o) {
    for (int64_t i = 0; i < s.inner; ++i) {
      int64_t best = 0;
      for (int64_t k = 0; k < s.size; ++k) {
        const double v = x[(o * s.size + k) * s.inner + i], b = x[(o * s.size + best) * s.inner + i];
        if (std::isnan(b)) break;
        if (std::isnan(v) || v > b) best = k;
      }
      idx[o * s.inner + i] = best;
    }
  }
  return idx;
}

TYPED_TEST(ReduceCpu, ArgmaxMatchesReferenceWithTiesAndNaN) {
  using T = TypeParam;
  for (const AxisShape& s : kShapes) {
    if (s.size == 0) continue;
    const int64_t n = s.outer * s.size * s.inner;
    // Few distinct values, so ties are everywhere; then a few NaNs in some rows.
    std::vector<T> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[i] = T((i * 2654435761u) % 5);
    for (bool with_nan : {false, true}) {
      if (with_nan) {
        for (int64_t i = n / 3; i < n; i += std::max<int64_t>(1, n / 4)) x[i] = std::numeric_limits<T>::quiet_NaN();
      }
      std::vector<int64_t> idx(static_cast<size_t>(s.outer * s.inner));
      argmax_cpu(dtype_of<T>(), s.outer, s.size, s.inner, x.data(), idx.data());
      const std::vector<int64_t> want = reference_argmax(s, std::vector<double>(x.begin(), x.end()).data());
      ASSERT_EQ(idx, want) << "shape " << s.outer << "," << s.size << "," << s.inner << " nan " << with_nan;
    }
  }
}

TYPED_TEST(ReduceCpu, ArgmaxOfLongRowAcrossBlocks) {
  using T = TypeParam;
  const int64_t n = 1000003;
  std::vector<T> x(n, T(0));
  x[777777] = T(9);
  x[999999] = T(9);  // a later tie in another block loses
  int64_t idx = -1;
  argmax_cpu(dtype_of<T>(), 1, n, 1, x.data(), &idx);
  EXPECT_EQ(idx, 777777);
  x[900000] = std::numeric_limits<T>::quiet_NaN();
  x[950000] = std::numeric_limits<T>::quiet_NaN();
  argmax_cpu(dtype_of<T>(), 1, n, 1, x.data(), &idx);
  EXPECT_EQ(idx, 900000);
  x[3] = -std::numeric_limits<T>::infinity();
  x[0] = std::numeric_limits<T>::quiet_NaN();
  argmax_cpu(dtype_of<T>(), 1, n, 1, x.data(), &idx);
  EXPECT_EQ(idx, 0);
}

TEST(ReduceCpuErrors, RejectsBadArguments) {
  float x[4] = {}, y[4] = {};
  int64_t idx[4];
  EXPECT_THROW(reduce_cpu(AxisReduction::Max, DType::Float32, 2, 0, 2, x, y), Error);
  EXPECT_THROW(reduce_cpu(AxisReduction::Mean, DType::Float32, 2, 0, 2, x, y), Error);
  EXPECT_THROW(reduce_cpu(AxisReduction::Sum, DType::Int64, 1, 4, 1, x, y), Error);
  EXPECT_THROW(reduce_cpu(AxisReduction::Sum, DType::Float32, -1, 4, 1, x, y), Error);
  EXPECT_THROW(argmax_cpu(DType::Float32, 1, 0, 1, x, idx), Error);
}

}  // namespace
}  // namespace dpe::kernels
