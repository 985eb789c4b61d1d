#include "layers/linear.h"

#include <gtest/gtest.h>

#include "core/autograd/grad_mode.h"
#include "core/ops.h"
#include "tests/testing/golden.h"
#include "tests/testing/gradcheck.h"

namespace dpe::nn {
namespace {

TEST(LinearTest, ComputesXWtPlusB) {
  Linear fc(3, 2);
  {
    NoGradGuard no_grad;
    fc.weight.copy_(Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}));
    fc.bias.copy_(Tensor::from_vector(std::vector<float>{10, 20}, {2}));
  }
  Tensor y = fc.forward(Tensor::from_vector(std::vector<float>{1, 1, 1, 0, 1, 0}, {2, 3}));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{16, 35, 12, 25}));
  EXPECT_EQ(fc.forward(ones({4, 5, 3})).shape(), (Shape{4, 5, 2}));  // leading dims kept
}

TEST(LinearTest, DefaultInitIsUniformWithinFanInBound) {
  manual_seed(0);
  Linear fc(100, 50);
  for (float w : fc.weight.to_vector<float>()) EXPECT_LE(std::abs(w), 0.1f);
  EXPECT_GT(max(fc.weight).item(), 0.09);  // it really spans the range
}

TEST(LinearTest, Gradcheck) {
  LinearOptions options{4, 3, true, TensorOptions(DType::Float64)};
  Linear fc(options);
  Tensor x = testing::randn_leaf({2, 5, 4}, 1);
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return fc.forward(in[0]); },
                               {x, fc.weight, fc.bias}),
            "");
}

TEST(LinearTest, MatchesPyTorch) {
  testing::Golden g = testing::load_golden("linear");  // tests/golden/gen_linear.py
  Linear fc(LinearOptions{5, 3, true, TensorOptions(DType::Float64)});
  {
    NoGradGuard no_grad;
    fc.weight.copy_(g.tensor("weight"));
    fc.bias.copy_(g.tensor("bias"));
  }
  Tensor x = g.tensor("x").clone().set_requires_grad(true);
  Tensor y = fc.forward(x);
  y.backward(g.tensor("dy"));
  // float64 on both sides: only summation order differs.
  EXPECT_LT(testing::max_relative_error(y, g.tensor("y")), 1e-12);
  EXPECT_LT(testing::max_relative_error(x.grad(), g.tensor("dx")), 1e-12);
  EXPECT_LT(testing::max_relative_error(fc.weight.grad(), g.tensor("dweight")), 1e-12);
  EXPECT_LT(testing::max_relative_error(fc.bias.grad(), g.tensor("dbias")), 1e-12);
}

}  // namespace
}  // namespace dpe::nn
