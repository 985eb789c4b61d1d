// Numerical gradient checks (float64) of every differentiable op in core/ops.h and tensor views.
#include <gtest/gtest.h>

#include "core/ops.h"
#include "tests/testing/gradcheck.h"

namespace dpe {
namespace {

using testing::gradcheck;
using testing::randn_away_from;
using testing::randn_leaf;

template <typename Fn, typename... Inputs>
std::string check_gradients(Fn&& fn, const Inputs&... inputs) {
  return gradcheck(std::forward<Fn>(fn), std::vector<Tensor>{inputs...});
}

// All arguments pass through __VA_ARGS__, so commas inside the lambda are safe.
#define EXPECT_GRADCHECK(...) EXPECT_EQ(check_gradients(__VA_ARGS__), "")

TEST(GradcheckTest, BroadcastingBinaryOps) {
  Tensor a = randn_leaf({3, 4}, 1), row = randn_leaf({4}, 2), col = randn_leaf({3, 1}, 3);
  Tensor pos = randn_away_from({3, 4}, 0.0, 0.5, 4);
  EXPECT_GRADCHECK([](auto& in) { return add(in[0], in[1]); }, a, row);
  EXPECT_GRADCHECK([](auto& in) { return sub(in[0], in[1]); }, a, col);
  EXPECT_GRADCHECK([](auto& in) { return mul(in[0], in[1]); }, col, row);
  EXPECT_GRADCHECK([](auto& in) { return div(in[0], in[1]); }, a, pos);
  EXPECT_GRADCHECK([](auto& in) { return mul(in[0], in[0]); }, a);
}

TEST(GradcheckTest, ScalarOps) {
  Tensor x = randn_leaf({5}, 5);
  EXPECT_GRADCHECK([](auto& in) { return affine(in[0], -1.5, 2.0); }, x);
  EXPECT_GRADCHECK([](auto& in) { return in[0] * 3.0 + 1.0; }, x);
  EXPECT_GRADCHECK([](auto& in) { return in[0] / 4.0 - 1.0; }, x);
  EXPECT_GRADCHECK([](auto& in) { return -in[0]; }, x);
}

// float64 leaf with values in [0.5, 2.5): inside the domain of log, sqrt, rsqrt, reciprocal.
Tensor positive_leaf(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return affine(rand(shape, DType::Float64, &gen), 2.0, 0.5).set_requires_grad(true);
}

TEST(GradcheckTest, UnaryMath) {
  Tensor x = randn_leaf({2, 3}, 6), pos = positive_leaf({2, 3}, 7);
  EXPECT_GRADCHECK([](auto& in) { return exp(in[0]); }, x);
  EXPECT_GRADCHECK([](auto& in) { return square(in[0]); }, x);
  EXPECT_GRADCHECK([](auto& in) { return log(in[0]); }, pos);
  EXPECT_GRADCHECK([](auto& in) { return sqrt(in[0]); }, pos);
  EXPECT_GRADCHECK([](auto& in) { return rsqrt(in[0]); }, pos);
  EXPECT_GRADCHECK([](auto& in) { return reciprocal(in[0]); }, pos);
}

TEST(GradcheckTest, Activations) {
  Tensor x = randn_away_from({4, 5}, 0.0, 0.05, 8);  // ReLU's kink at 0 avoided
  EXPECT_GRADCHECK([](auto& in) { return relu(in[0]); }, x);
  EXPECT_GRADCHECK([](auto& in) { return gelu(in[0]); }, x);
  EXPECT_GRADCHECK([](auto& in) { return silu(in[0]); }, x);
  EXPECT_GRADCHECK([](auto& in) { return tanh(in[0]); }, x);
  EXPECT_GRADCHECK([](auto& in) { return sigmoid(in[0]); }, x);
}

// silu_mul: the fused CPU kernel (one shape, contiguous), with one operand differentiable, and the composition
// it falls back to (broadcasting, a transposed view).
TEST(GradcheckTest, SiluMul) {
  Tensor gate = randn_leaf({4, 5}, 20), up = randn_leaf({4, 5}, 21), row = randn_leaf({5}, 22);
  EXPECT_GRADCHECK([](auto& in) { return silu_mul(in[0], in[1]); }, gate, up);
  EXPECT_GRADCHECK([&](auto& in) { return silu_mul(in[0], up.detach()); }, gate);
  EXPECT_GRADCHECK([&](auto& in) { return silu_mul(gate.detach(), in[0]); }, up);
  EXPECT_GRADCHECK([](auto& in) { return silu_mul(in[0], in[1]); }, gate, row);
  EXPECT_GRADCHECK([](auto& in) { return silu_mul(in[0].t(), in[1].t()); }, gate, up);
}

TEST(GradcheckTest, Reductions) {
  Tensor x = randn_leaf({3, 4, 2}, 9);
  EXPECT_GRADCHECK([](auto& in) { return sum(in[0]); }, x);
  EXPECT_GRADCHECK([](auto& in) { return sum(in[0], 1); }, x);
  EXPECT_GRADCHECK([](auto& in) { return sum(in[0], -1, true); }, x);
  EXPECT_GRADCHECK([](auto& in) { return sum(in[0], std::vector<int64_t>{0, 2}); }, x);
  EXPECT_GRADCHECK([](auto& in) { return mean(in[0]); }, x);
  EXPECT_GRADCHECK([](auto& in) { return mean(in[0], 0, true); }, x);
  EXPECT_GRADCHECK([](auto& in) { return sum_to(in[0], {1, 4, 1}); }, x);
  // Random normals have no ties, so max/min are differentiable at these points.
  EXPECT_GRADCHECK([](auto& in) { return max(in[0]); }, x);
  EXPECT_GRADCHECK([](auto& in) { return min(in[0]); }, x);
  EXPECT_GRADCHECK([](auto& in) { return max(in[0], 1).values; }, x);
  EXPECT_GRADCHECK([](auto& in) { return max(in[0], 2, true).values; }, x);
}

TEST(GradcheckTest, Matmul) {
  Tensor a = randn_leaf({3, 4}, 10), b = randn_leaf({4, 5}, 11);
  Tensor ba = randn_leaf({2, 3, 4}, 12), bb = randn_leaf({2, 4, 5}, 13);
  EXPECT_GRADCHECK([](auto& in) { return matmul(in[0], in[1]); }, a, b);
  EXPECT_GRADCHECK([](auto& in) { return matmul(in[1].t(), in[0].t()); }, a, b);  // transposed views
  EXPECT_GRADCHECK([](auto& in) { return bmm(in[0], in[1]); }, ba, bb);
  EXPECT_GRADCHECK([](auto& in) { return matmul(in[0], in[1]); }, ba, b);  // broadcast 2-d right
  EXPECT_GRADCHECK([](auto& in) { return matmul(in[0], in[1]); }, a, bb);  // broadcast 2-d left
}

TEST(GradcheckTest, Softmax) {
  Tensor x = randn_leaf({3, 5}, 14), y = randn_leaf({2, 3, 4}, 15);
  EXPECT_GRADCHECK([](auto& in) { return softmax(in[0], 1); }, x);
  EXPECT_GRADCHECK([](auto& in) { return log_softmax(in[0], -1); }, x);
  EXPECT_GRADCHECK([](auto& in) { return softmax(in[0], 1); }, y);  // inner > 1
  EXPECT_GRADCHECK([](auto& in) { return log_softmax(in[0], 0); }, y);
}

TEST(GradcheckTest, ViewsAndJoins) {
  Tensor x = randn_leaf({4, 3}, 16), y = randn_leaf({2, 3}, 17);
  EXPECT_GRADCHECK([](auto& in) { return in[0].narrow(0, 1, 2) * 2.0; }, x);
  EXPECT_GRADCHECK([](auto& in) { return in[0].select(1, 2); }, x);
  EXPECT_GRADCHECK([](auto& in) { return in[0].chunk(3, 0)[1]; }, x);
  EXPECT_GRADCHECK([](auto& in) { return in[0].t().reshape({-1}); }, x);
  EXPECT_GRADCHECK([](auto& in) { return in[0].view({2, 6}); }, x);
  EXPECT_GRADCHECK([](auto& in) { return in[0].unsqueeze(1).expand({4, 2, 3}); }, x);
  EXPECT_GRADCHECK([](auto& in) { return in[0].unsqueeze(0).squeeze(0).flatten(); }, x);
  EXPECT_GRADCHECK([](auto& in) { return in[0].reshape({2, 2, 3}).permute({2, 0, 1}).contiguous(); }, x);
  EXPECT_GRADCHECK([](auto& in) { return cat({in[0], in[1], in[0]}, 0); }, x, y);
  EXPECT_GRADCHECK([](auto& in) { return stack({in[0], in[0] * 2.0}, 1); }, y);
  EXPECT_GRADCHECK([](auto& in) { return in[0].clone(); }, x);
  EXPECT_GRADCHECK([](auto& in) { return in[0].to(Device::cpu(1)); }, x);
}

TEST(GradcheckTest, CheckerCatchesAWrongGradient) {
  // A deliberately wrong backward (relu's gradient used for tanh) must be reported.
  Tensor x = randn_away_from({6}, 0.0, 0.1, 18);
  std::string report = gradcheck([](auto& in) { return tanh(relu(in[0])) + relu(in[0]) * 0.0; }, {x});
  EXPECT_EQ(report, "");  // a correct composition passes...
  report = gradcheck([](const std::vector<Tensor>& in) {
    Tensor y = relu(in[0]);
    return y + (tanh(in[0].detach()) - in[0].detach());  // ...a function whose graph misses a term fails
  }, {x});
  EXPECT_NE(report, "");
}

}  // namespace
}  // namespace dpe
