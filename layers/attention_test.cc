#include "layers/attention.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops.h"
#include "tests/testing/golden.h"
#include "tests/testing/gradcheck.h"

namespace dpe::nn {
namespace {

// A float64 attention block with seeded weights.
std::shared_ptr<CausalSelfAttention> make_attention(int64_t dim, int64_t heads, uint64_t seed = 0) {
  manual_seed(seed);
  auto attn = std::make_shared<CausalSelfAttention>(dim, heads);
  attn->to(DType::Float64);
  return attn;
}

double max_abs(const Tensor& t) { return max_abs_diff(t, zeros_like(t)); }

bool all_finite(const Tensor& t) {
  for (double v : t.to_vector<double>())
    if (!std::isfinite(v)) return false;
  return true;
}

TEST(AttentionTest, ShapesNamesAndChecks) {
  CausalSelfAttention attn(8, 2);
  EXPECT_EQ(attn.head_dim(), 4);
  EXPECT_EQ(attn.forward(randn({3, 5, 8})).shape(), (Shape{3, 5, 8}));
  EXPECT_EQ(attn.forward(randn({3, 5, 8}), ones({3, 5})).shape(), (Shape{3, 5, 8}));
  std::vector<std::string> names;
  for (const auto& [name, t] : attn.named_parameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"wq.weight", "wk.weight", "wv.weight", "wo.weight"}));
  EXPECT_THROW(CausalSelfAttention(10, 3), Error);  // dim % num_heads != 0
  EXPECT_THROW(CausalSelfAttention(6, 2), Error);   // odd head_dim: no RoPE pairs
  EXPECT_THROW(attn.forward(randn({3, 5, 7})), Error);
  EXPECT_THROW(attn.forward(randn({3, 5, 8}), ones({3, 4})), Error);
}

TEST(AttentionTest, RotaryTablesAndRotation) {
  // head_dim 4: frequencies 1 and 10000^(-1/2) = 0.01; columns i and i + 2 share one.
  functional::RotaryTables t = functional::rotary_tables(3, 4, 10000.0, TensorOptions(DType::Float64));
  std::vector<double> c = t.cos.to_vector<double>(), s = t.sin.to_vector<double>();
  EXPECT_DOUBLE_EQ(c[0], 1.0);
  EXPECT_DOUBLE_EQ(s[0], 0.0);
  EXPECT_DOUBLE_EQ(c[2 * 4 + 0], std::cos(2.0));
  EXPECT_DOUBLE_EQ(c[2 * 4 + 2], std::cos(2.0));
  EXPECT_DOUBLE_EQ(s[1 * 4 + 1], std::sin(0.01));
  EXPECT_DOUBLE_EQ(s[1 * 4 + 3], std::sin(0.01));
  // rotate_half pairs (x[i], x[i + d/2]): at position 1, (1, 0) in pair 0 rotates by angle 1.
  Tensor x = Tensor::from_vector(std::vector<double>{1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0}, {3, 4});
  std::vector<double> y = functional::apply_rotary_emb(x, t.cos, t.sin).to_vector<double>();
  EXPECT_NEAR(y[4 + 0], std::cos(1.0), 1e-15);
  EXPECT_NEAR(y[4 + 2], std::sin(1.0), 1e-15);
  EXPECT_NEAR(y[8 + 0], std::cos(2.0), 1e-15);
  EXPECT_NEAR(y[8 + 2], std::sin(2.0), 1e-15);
  EXPECT_EQ(y[4 + 1], 0.0);
}

TEST(AttentionTest, RotaryGradcheck) {
  functional::RotaryTables t = functional::rotary_tables(5, 6, 100.0, TensorOptions(DType::Float64));
  Tensor x = testing::randn_leaf({2, 3, 5, 6}, 3);
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return functional::apply_rotary_emb(in[0], t.cos, t.sin); },
                               {x}),
            "");
}

TEST(AttentionTest, IsCausal) {
  auto attn = make_attention(8, 2);
  Tensor x = randn({2, 6, 8}, DType::Float64);
  Tensor y = attn->forward(x);
  for (int64_t t = 0; t < 5; ++t) {
    Tensor x2 = x.clone();
    x2.narrow(1, t + 1, 6 - t - 1).copy_(randn({2, 6 - t - 1, 8}, DType::Float64));
    Tensor y2 = attn->forward(x2);
    EXPECT_LT(max_abs_diff(y.narrow(1, 0, t + 1), y2.narrow(1, 0, t + 1)), 1e-12) << "t = " << t;
    EXPECT_GT(max_abs_diff(y.narrow(1, t + 1, 1), y2.narrow(1, t + 1, 1)), 1e-6) << "t = " << t;  // test can fail
  }
}

TEST(AttentionTest, PaddedKeysDoNotAffectRealTokens) {
  // Sample 1 is left-padded by 2: its real tokens are positions 2..5.
  auto attn = make_attention(8, 2, 1);
  Tensor mask = Tensor::from_vector(std::vector<int64_t>{1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1}, {2, 6});
  Tensor x = randn({2, 6, 8}, DType::Float64);
  Tensor y = attn->forward(x, mask);
  Tensor x2 = x.clone();
  x2.select(0, 1).narrow(0, 0, 2).copy_(randn({2, 8}, DType::Float64));
  Tensor y2 = attn->forward(x2, mask);
  EXPECT_LT(max_abs_diff(y, y2), 1e-12);  // padded queries output zeros in both, real ones are unchanged
  EXPECT_EQ(max_abs(y.select(0, 1).narrow(0, 0, 2)), 0.0);
  // Without the mask the padded values leak into the real rows (so the check above can fail).
  EXPECT_GT(max_abs_diff(attn->forward(x).select(0, 1), attn->forward(x2).select(0, 1)), 1e-6);
}

TEST(AttentionTest, LeftPaddedEqualsUnpadded) {
  // RoPE scores depend on position differences only, so the shifted real tokens attend as they would alone.
  auto attn = make_attention(8, 2, 2);
  Tensor x = randn({1, 6, 8}, DType::Float64);
  Tensor mask = Tensor::from_vector(std::vector<int64_t>{0, 0, 1, 1, 1, 1}, {1, 6});
  Tensor padded = attn->forward(x, mask).narrow(1, 2, 4);
  Tensor alone = attn->forward(x.narrow(1, 2, 4).contiguous());
  EXPECT_LT(testing::max_relative_error(padded, alone), 1e-10);
  // all-ones mask == causal only
  EXPECT_LT(max_abs_diff(attn->forward(x, ones({1, 6}, DType::Int64)), attn->forward(x)), 1e-14);
}

TEST(AttentionTest, FullyMaskedRowsGiveZerosNotNaN) {
  auto attn = make_attention(4, 1, 3);
  Tensor mask = Tensor::from_vector(std::vector<float>{0, 0, 0, 0, 1, 1}, {2, 3});  // sample 0 all padding
  Tensor x = testing::randn_leaf({2, 3, 4}, 4);
  Tensor y = attn->forward(x, mask);
  EXPECT_TRUE(all_finite(y));
  EXPECT_EQ(max_abs(y.select(0, 0)), 0.0);
  EXPECT_EQ(max_abs(y.select(0, 1).select(0, 0)), 0.0);
  sum(y).backward();
  EXPECT_TRUE(all_finite(x.grad()));
  EXPECT_EQ(max_abs(x.grad().select(0, 0)), 0.0);
  for (const Tensor& p : attn->parameters()) EXPECT_TRUE(all_finite(p.grad()));
}

TEST(AttentionTest, Gradcheck) {
  auto attn = make_attention(8, 2, 5);
  Tensor x = testing::randn_leaf({2, 4, 8}, 6);
  std::vector<Tensor> inputs = {x};
  for (const Tensor& p : attn->parameters()) inputs.push_back(p);
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return attn->forward(in[0]); }, inputs), "");
  Tensor mask = Tensor::from_vector(std::vector<int64_t>{1, 1, 1, 0, 0, 1, 1, 1}, {2, 4});
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return attn->forward(in[0], mask); }, inputs), "");
}

TEST(AttentionTest, CloneIsDeepAndEqual) {
  auto attn = make_attention(8, 2, 7);
  Tensor x = randn({1, 3, 8}, DType::Float64);
  Tensor y = attn->forward(x);
  auto copy = clone_module(*attn, Device::cpu(1));
  EXPECT_LT(max_abs_diff(copy->forward(x.to(Device::cpu(1))).to(Device::cpu(0)), y), 1e-15);
  EXPECT_FALSE(copy->wq->weight.storage() == attn->wq->weight.storage());
}

TEST(AttentionTest, MatchesPyTorch) {
  testing::Golden g = testing::load_golden("attention");  // tests/golden/gen_llama.py
  CausalSelfAttention attn(8, 2);
  attn.to(DType::Float64);
  StateDict state;
  for (const auto& [name, t] : attn.named_parameters()) state.emplace_back(name, g.tensor("p." + name));
  attn.load_state_dict(state);
  Tensor x = g.tensor("x").clone().set_requires_grad(true);
  Tensor y = attn.forward(x, g.tensor("mask"));
  y.backward(g.tensor("dy"));
  // float64 on both sides: only summation order differs.
  EXPECT_LT(testing::max_relative_error(y, g.tensor("y")), 1e-10);
  EXPECT_LT(testing::max_relative_error(x.grad(), g.tensor("dx")), 1e-10);
  for (const auto& [name, p] : attn.named_parameters())
    EXPECT_LT(testing::max_relative_error(p.grad(), g.tensor("g." + name)), 1e-10) << name;
  NoGradGuard no_grad;
  EXPECT_LT(testing::max_relative_error(attn.forward(g.tensor("x")), g.tensor("y_nomask")), 1e-10);
}

}  // namespace
}  // namespace dpe::nn
