#include "optim/clip_grad.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/ops.h"
#include "tests/testing/golden.h"

namespace dpe::optim {
namespace {

TEST(ClipGradTest, MatchesPyTorch) {
  testing::Golden g = testing::load_golden("optim");  // tests/golden/gen_optim.py
  const std::pair<const char*, double> norms[] = {
      {"2", 2.0}, {"1", 1.0}, {"3", 3.0}, {"inf", std::numeric_limits<double>::infinity()}};
  for (auto [tag, norm_type] : norms) {
    for (int max_norm : {1, 100}) {
      const std::string key = std::string("clip_") + tag + "_" + std::to_string(max_norm);
      SCOPED_TRACE(key);
      std::vector<Tensor> ps;
      for (int i = 0; i < 3; ++i) {
        Tensor grad = g.tensor("clip_g" + std::to_string(i));
        ps.push_back(zeros(grad.shape(), TensorOptions(DType::Float64)).set_requires_grad(true));
        ps.back().set_grad(grad.clone());
      }
      double total = clip_grad_norm_(ps, max_norm, norm_type);
      EXPECT_NEAR(total, g.tensor(key + "_total").item(), 1e-10 * total);
      for (int i = 0; i < 3; ++i) {
        EXPECT_LT(testing::max_relative_error(ps[i].grad(), g.tensor(key + "_g" + std::to_string(i))), 1e-10);
      }
    }
  }
}

TEST(ClipGradTest, UnitValuesAndSkipsMissingGrads) {
  Tensor a = zeros({2}, TensorOptions(DType::Float64)).set_requires_grad(true);
  Tensor b = zeros({2}, TensorOptions(DType::Float64)).set_requires_grad(true);
  EXPECT_EQ(clip_grad_norm_({a, b}, 1.0), 0.0);  // no grads at all
  a.set_grad(Tensor::from_vector(std::vector<double>{3, 4}, {2}));
  EXPECT_DOUBLE_EQ(clip_grad_norm_({a, b}, 10.0), 5.0);
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{3, 4}));  // under max_norm: unchanged
  EXPECT_DOUBLE_EQ(clip_grad_norm_({a, b}, 1.0), 5.0);
  EXPECT_NEAR(a.grad().to_vector<double>()[0], 3.0 / (5.0 + 1e-6), 1e-15);
}

}  // namespace
}  // namespace dpe::optim
