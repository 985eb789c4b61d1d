// amp_unscale_cpu against its contract (core/kernels/amp.h): every element times inv_scale, found_inf set
// exactly when an element was inf or NaN before unscaling, never cleared; on the serial and parallel paths.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/kernels/amp.h"
#include "tests/testing/kernel_test_util.h"

namespace dpe::kernels {
namespace {

template <typename T>
class AmpCpu : public ::testing::Test {};
TYPED_TEST_SUITE(AmpCpu, FloatTypes);

// 100003 elements take the parallel path (cpu_parallel.h's grain is 32768).
const int64_t kSizes[] = {0, 1, 7, 100003};

TYPED_TEST(AmpCpu, UnscalesEveryElementExactlyForAPowerOfTwo) {
  using T = TypeParam;
  for (int64_t n : kSizes) {
    const std::vector<T> original = random_vector<T>(n, -1e4, 1e4, 11);
    std::vector<T> g = original;
    float found = 0.0f;
    amp_unscale_cpu(dtype_of<T>(), n, g.data(), 1.0f / 65536.0f, &found);
    EXPECT_EQ(found, 0.0f) << "n=" << n;
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(g[i], original[i] / T(65536)) << "n=" << n << " i=" << i;
  }
}

TYPED_TEST(AmpCpu, FindsInfAndNanAnywhere) {
  using T = TypeParam;
  const T specials[] = {std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity(),
                        std::numeric_limits<T>::quiet_NaN()};
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{100003}}) {
    for (T special : specials) {
      for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
        std::vector<T> g = random_vector<T>(n, -1, 1, 12);
        g[at] = special;
        float found = 0.0f;
        amp_unscale_cpu(dtype_of<T>(), n, g.data(), 0.5f, &found);
        EXPECT_EQ(found, 1.0f) << "n=" << n << " value " << special << " at " << at;
        // Non-finite elements are multiplied too: inf stays inf, NaN stays NaN.
        EXPECT_EQ(std::isnan(g[at]), std::isnan(special)) << "n=" << n << " at " << at;
      }
    }
  }
}

TYPED_TEST(AmpCpu, LargeFiniteValuesAreNotInfEvenWhenTheirSumOverflows) {
  using T = TypeParam;
  // Each is finite; their sum (and sum of squares) overflows T: a sum-based check would report an inf.
  const int64_t n = 100003;
  std::vector<T> g(n, std::numeric_limits<T>::max());
  float found = 0.0f;
  amp_unscale_cpu(dtype_of<T>(), n, g.data(), 0.25f, &found);
  EXPECT_EQ(found, 0.0f);
  EXPECT_EQ(g[n - 1], std::numeric_limits<T>::max() * T(0.25));
}

TYPED_TEST(AmpCpu, TheFlagIsNeverCleared) {
  using T = TypeParam;
  std::vector<T> g = random_vector<T>(7, -1, 1, 13);
  float found = 1.0f;  // set by an earlier gradient of the same set
  amp_unscale_cpu(dtype_of<T>(), 7, g.data(), 1.0f, &found);
  EXPECT_EQ(found, 1.0f);
}

TEST(AmpCpu, RefusesOtherDtypesAndNegativeSizes) {
  std::vector<int64_t> ints(3, 1);
  float found = 0.0f;
  EXPECT_THROW(amp_unscale_cpu(DType::Int64, 3, ints.data(), 1.0f, &found), Error);
  EXPECT_THROW(amp_unscale_cpu(DType::Float32, -1, ints.data(), 1.0f, &found), Error);
}

}  // namespace
}  // namespace dpe::kernels
