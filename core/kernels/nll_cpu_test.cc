// nll_forward_cpu / nll_backward_cpu against direct indexing over (outer, classes, inner), ignore_index,
// and the target bounds check of the contract in nll.h.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "core/kernels/nll.h"
#include "tests/testing/kernel_test_util.h"

namespace dpe::kernels {
namespace {

template <typename T>
class NllCpuTest : public ::testing::Test {};
TYPED_TEST_SUITE(NllCpuTest, FloatTypes);

TYPED_TEST(NllCpuTest, ForwardAndBackwardIndexTheTarget) {
  using T = TypeParam;
  const int64_t outer = 2, classes = 3, inner = 4;
  std::vector<T> lp = random_vector<T>(outer * classes * inner, -3, 0, 1);
  std::vector<int64_t> target = {0, 2, -100, 1, 2, 2, 0, -100};
  std::vector<T> loss(outer * inner, T(-7)), valid(outer * inner, T(-7));
  nll_forward_cpu(dtype_of<T>(), outer, classes, inner, lp.data(), target.data(), -100, loss.data(), valid.data());
  std::vector<T> g = random_vector<T>(outer * inner, -1, 1, 2);
  std::vector<T> dx(outer * classes * inner, T(99));  // overwritten, not accumulated
  nll_backward_cpu(dtype_of<T>(), outer, classes, inner, target.data(), -100, g.data(), dx.data());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t k = o * inner + i, t = target[k];
      EXPECT_EQ(loss[k], t == -100 ? T(0) : -lp[(o * classes + t) * inner + i]) << k;
      EXPECT_EQ(valid[k], t == -100 ? T(0) : T(1)) << k;
      for (int64_t c = 0; c < classes; ++c) {
        EXPECT_EQ(dx[(o * classes + c) * inner + i], c == t ? -g[k] : T(0)) << k << " " << c;
      }
    }
  }
}

TEST(NllCpuTest, OutOfRangeTargetNamesValueAndClasses) {
  std::vector<double> lp(6, -1.0), loss(2), valid(2), g(2, 1.0), dx(6);
  std::vector<int64_t> target = {1, 3};
  try {
    nll_forward_cpu(DType::Float64, 2, 3, 1, lp.data(), target.data(), -100, loss.data(), valid.data());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nll_forward_cpu: target 3 is out of bounds for 3 classes"),
              std::string::npos)
        << e.what();
  }
  target = {-1, 0};
  EXPECT_THROW(nll_backward_cpu(DType::Float64, 2, 3, 1, target.data(), -100, g.data(), dx.data()), Error);
  target = {7, 0};  // ignore_index may lie outside [0, classes)
  nll_forward_cpu(DType::Float64, 2, 3, 1, lp.data(), target.data(), 7, loss.data(), valid.data());
  EXPECT_EQ(valid, (std::vector<double>{0, 1}));
  EXPECT_THROW(nll_forward_cpu(DType::Int64, 2, 3, 1, lp.data(), target.data(), 7, loss.data(), valid.data()), Error);
}

}  // namespace
}  // namespace dpe::kernels
