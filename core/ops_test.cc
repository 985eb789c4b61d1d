// Forward values of the ops against numbers computed by hand.
#include "core/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace dpe {
namespace {

Tensor vec(std::vector<float> v, Shape shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(v.size())};
  return Tensor::from_vector(v, shape);
}

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }

TEST(OpsTest, BinaryWithBroadcasting) {
  Tensor a = vec({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor row = vec({10, 20, 30}, {3});
  Tensor col = vec({100, 200}, {2, 1});
  EXPECT_EQ(values(a + row), (std::vector<float>{11, 22, 33, 14, 25, 36}));
  EXPECT_EQ(values(a + col), (std::vector<float>{101, 102, 103, 204, 205, 206}));
  EXPECT_EQ(values(a - row), (std::vector<float>{-9, -18, -27, -6, -15, -24}));
  EXPECT_EQ(values(a * col), (std::vector<float>{100, 200, 300, 800, 1000, 1200}));
  EXPECT_EQ(values(a / vec({1, 2, 4})), (std::vector<float>{1, 1, 0.75f, 4, 2.5f, 1.5f}));
  EXPECT_EQ((row + col).shape(), (Shape{2, 3}));
  EXPECT_EQ(values(a * 2.0), (std::vector<float>{2, 4, 6, 8, 10, 12}));
  EXPECT_EQ(values(affine(a, -1, 1)), (std::vector<float>{0, -1, -2, -3, -4, -5}));
  try {
    a + vec({1, 2});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shapes [2, 3] and [2] are not broadcastable"), std::string::npos) << e.what();
  }
}

TEST(OpsTest, UnaryAndActivations) {
  Tensor x = Tensor::from_vector(std::vector<double>{-2, -0.5, 0.5, 2}, {4});
  auto at = [](const Tensor& t, int i) { return t.to_vector<double>()[i]; };
  EXPECT_DOUBLE_EQ(at(relu(x), 0), 0.0);
  EXPECT_DOUBLE_EQ(at(relu(x), 3), 2.0);
  EXPECT_NEAR(at(gelu(x), 2), 0.5 * 0.5 * (1 + std::erf(0.5 / std::sqrt(2.0))), 1e-15);
  EXPECT_NEAR(at(silu(x), 0), -2.0 / (1 + std::exp(2.0)), 1e-15);
  EXPECT_NEAR(at(tanh(x), 1), std::tanh(-0.5), 1e-15);
  EXPECT_NEAR(at(sigmoid(x), 3), 1 / (1 + std::exp(-2.0)), 1e-15);
  EXPECT_NEAR(at(exp(x), 3), std::exp(2.0), 1e-12);
  EXPECT_NEAR(at(log(exp(x)), 1), -0.5, 1e-15);
  EXPECT_NEAR(at(sqrt(square(x)), 0), 2.0, 1e-15);
  EXPECT_NEAR(at(rsqrt(square(x)), 3), 0.5, 1e-15);
  EXPECT_NEAR(at(reciprocal(x), 2), 2.0, 1e-15);
  EXPECT_THROW(relu(zeros({2}, DType::Int64)), Error);
}

// silu_mul's fused CPU kernel gives the numbers of mul(silu(gate), up), forward and backward (float32, both
// operands differentiable), and its errors name the operands.
TEST(OpsTest, SiluMulIsTheComposition) {
  Tensor gate = randn({6, 37}) * 4.0, up = randn({6, 37}), dy = randn({6, 37});
  Tensor g1 = gate.detach().set_requires_grad(true), u1 = up.detach().set_requires_grad(true);
  Tensor g2 = gate.detach().set_requires_grad(true), u2 = up.detach().set_requires_grad(true);
  Tensor fused = silu_mul(g1, u1), composed = mul(silu(g2), u2);
  EXPECT_TRUE(equal(fused, composed));
  fused.backward(dy);
  composed.backward(dy);
  EXPECT_TRUE(equal(g1.grad(), g2.grad()));
  EXPECT_TRUE(equal(u1.grad(), u2.grad()));
  EXPECT_EQ(silu_mul(zeros({0, 3}), zeros({0, 3})).shape(), (Shape{0, 3}));
  try {
    silu_mul(gate, up.to(DType::Float64));
    ADD_FAILURE() << "no error for mixed dtypes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("silu_mul: dtypes differ (float32 and float64)"), std::string::npos)
        << e.what();
  }
}

TEST(OpsTest, Reductions) {
  Tensor a = vec({1, 5, 3, 4, 2, 6}, {2, 3});
  EXPECT_EQ(sum(a).item(), 21);
  EXPECT_EQ(values(sum(a, 0)), (std::vector<float>{5, 7, 9}));
  EXPECT_EQ(values(sum(a, 1)), (std::vector<float>{9, 12}));
  EXPECT_EQ(sum(a, 1, true).shape(), (Shape{2, 1}));
  EXPECT_EQ(values(sum(a, {0, 1})), (std::vector<float>{21}));
  EXPECT_EQ(mean(a).item(), 3.5);
  EXPECT_EQ(values(mean(a, -1)), (std::vector<float>{3, 4}));
  EXPECT_EQ(max(a).item(), 6);
  EXPECT_EQ(min(a).item(), 1);
  ValuesIndices m = max(a, 1);
  EXPECT_EQ(values(m.values), (std::vector<float>{5, 6}));
  EXPECT_EQ(m.indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(argmax(a, 0).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(argmax(vec({3, 7, 7}), 0).item(), 1);  // first maximum
  EXPECT_EQ(values(sum_to(a, {1, 3})), (std::vector<float>{5, 7, 9}));
  EXPECT_EQ(values(sum_to(a, {3})), (std::vector<float>{5, 7, 9}));
  EXPECT_EQ(sum(zeros({0})).item(), 0);
  EXPECT_THROW(max(zeros({0})), Error);
  EXPECT_THROW(mean(a, 2), Error);
}

// sum over several dimensions reduces each run of adjacent ones in one pass over their product: the same
// shapes, keepdim or not, empty dimensions, and values and gradients as one dimension at a time.
TEST(OpsTest, SumOverSeveralDimensions) {
  const std::vector<std::vector<int64_t>> cases = {{0, 2, 3}, {1, 2}, {3, 1, 2}, {0, 3}, {0, 1, 2, 3}};
  for (const std::vector<int64_t>& dims : cases) {
    for (bool keepdim : {false, true}) {
      SCOPED_TRACE(detail::str_cat("dims ", dims.size(), " from ", dims[0], keepdim ? ", keepdim" : ""));
      Tensor x = arange(120).reshape({2, 3, 4, 5}).set_requires_grad(true);
      std::vector<int64_t> sorted = dims;
      std::sort(sorted.rbegin(), sorted.rend());
      Tensor one_at_a_time = x.detach();
      for (int64_t d : sorted) one_at_a_time = sum(one_at_a_time, d, keepdim);
      Tensor y = sum(x, dims, keepdim);
      EXPECT_EQ(y.shape(), one_at_a_time.shape());
      EXPECT_EQ(values(y), values(one_at_a_time));  // small integers: exact in any order
      sum(mul(y, y)).backward();  // dx = 2 y, broadcast over the reduced dimensions
      Tensor expected = y.detach();
      if (!keepdim) {
        for (auto d = sorted.rbegin(); d != sorted.rend(); ++d) expected = expected.unsqueeze(*d);
      }
      EXPECT_EQ(values(x.grad()), values(mul(expected.expand(x.shape()), 2.0).contiguous()));
    }
  }
  EXPECT_EQ(sum(zeros({2, 0, 3}), {1, 2}).shape(), (Shape{2}));
  EXPECT_EQ(sum(zeros({2, 0, 3}), {1, 2}, true).shape(), (Shape{2, 1, 1}));
  EXPECT_EQ(values(sum(zeros({2, 0, 3}), {1, 2}, true)), (std::vector<float>{0, 0}));
}

TEST(OpsTest, Matmul) {
  Tensor a = vec({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = vec({1, 0, 0, 1, 1, 1}, {3, 2});
  EXPECT_EQ(values(matmul(a, b)), (std::vector<float>{4, 5, 10, 11}));
  // Transposed views go to the GEMM without a copy and give the same numbers.
  EXPECT_EQ(values(matmul(b.t(), a.t())), (std::vector<float>{4, 10, 5, 11}));
  Tensor batch = stack({a, a * 2.0});
  EXPECT_EQ(values(matmul(batch, b)), (std::vector<float>{4, 5, 10, 11, 8, 10, 20, 22}));
  EXPECT_EQ(values(bmm(batch, stack({b, b}))), (std::vector<float>{4, 5, 10, 11, 8, 10, 20, 22}));
  EXPECT_EQ(values(matmul(a, stack({b, b}))), (std::vector<float>{4, 5, 10, 11, 4, 5, 10, 11}));
  try {
    matmul(a, a);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("inner dimensions differ: [2, 3] @ [2, 3]"), std::string::npos) << e.what();
  }
}

TEST(OpsTest, SoftmaxAndLogSoftmax) {
  Tensor x = Tensor::from_vector(std::vector<double>{1, 2, 3, 1000, 1000, 1000}, {2, 3});
  std::vector<double> s = softmax(x, 1).to_vector<double>();
  double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_NEAR(s[0], std::exp(1.0) / z, 1e-15);
  EXPECT_NEAR(s[4], 1.0 / 3, 1e-15);  // stable for large inputs
  std::vector<double> ls = log_softmax(x, -1).to_vector<double>();
  EXPECT_NEAR(ls[2], 3 - std::log(z), 1e-14);
  std::vector<double> s0 = softmax(x, 0).to_vector<double>();
  EXPECT_NEAR(s0[0] + s0[3], 1.0, 1e-15);
}

TEST(OpsTest, CatAndStack) {
  Tensor a = vec({1, 2}, {1, 2}), b = vec({3, 4, 5, 6}, {2, 2});
  EXPECT_EQ(values(cat({a, b}, 0)), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(values(cat({b, b}, 1)), (std::vector<float>{3, 4, 3, 4, 5, 6, 5, 6}));
  EXPECT_EQ(stack({a, a}, 0).shape(), (Shape{2, 1, 2}));
  try {
    cat({a, b}, 1);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("they may differ only in dimension 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dpe
