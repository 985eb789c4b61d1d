#include "layers/attention.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops/attention.h"
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

// ---- grouped-query attention ----

std::shared_ptr<CausalSelfAttention> make_gqa(int64_t dim, int64_t heads, int64_t kv_heads, uint64_t seed,
                                              DType dtype = DType::Float64) {
  manual_seed(seed);
  auto attn = std::make_shared<CausalSelfAttention>(
      CausalSelfAttentionOptions{.dim = dim, .num_heads = heads, .num_kv_heads = kv_heads});
  attn->to(dtype);
  return attn;
}

// The multi-head attention that a grouped-query one is: the same wq and wo, and wk, wv with each key/value
// head's rows repeated for every query head of its group.
std::shared_ptr<CausalSelfAttention> as_multi_head(const CausalSelfAttention& gqa) {
  auto mha = std::make_shared<CausalSelfAttention>(gqa.dim(), gqa.num_heads());
  mha->to(gqa.wq->weight.dtype());
  const int64_t n_rep = gqa.num_heads() / gqa.num_kv_heads(), hd = gqa.head_dim();
  auto rows = [&](const Tensor& w) {  // (KV * hd, dim) -> (H * hd, dim)
    return functional::repeat_kv(w.detach().view({gqa.num_kv_heads(), hd, gqa.dim()}), n_rep, 0)
        .view({gqa.dim(), gqa.dim()});
  };
  NoGradGuard no_grad;
  mha->wq->weight.copy_(gqa.wq->weight);
  mha->wo->weight.copy_(gqa.wo->weight);
  mha->wk->weight.copy_(rows(gqa.wk->weight));
  mha->wv->weight.copy_(rows(gqa.wv->weight));
  return mha;
}

TEST(AttentionTest, GroupedQueryShapesNamesAndChecks) {
  CausalSelfAttention attn(CausalSelfAttentionOptions{.dim = 16, .num_heads = 4, .num_kv_heads = 2});
  EXPECT_EQ(attn.num_kv_heads(), 2);
  EXPECT_EQ(attn.head_dim(), 4);
  EXPECT_EQ(attn.wq->weight.shape(), (Shape{16, 16}));
  EXPECT_EQ(attn.wk->weight.shape(), (Shape{8, 16}));
  EXPECT_EQ(attn.wv->weight.shape(), (Shape{8, 16}));
  EXPECT_EQ(attn.wo->weight.shape(), (Shape{16, 16}));
  EXPECT_EQ(attn.forward(randn({2, 5, 16})).shape(), (Shape{2, 5, 16}));
  EXPECT_EQ(attn.forward(randn({2, 5, 16}), ones({2, 5})).shape(), (Shape{2, 5, 16}));
  EXPECT_EQ(CausalSelfAttention(8, 2).num_kv_heads(), 2);  // default: multi-head
  EXPECT_EQ(CausalSelfAttention(CausalSelfAttentionOptions{.dim = 8, .num_heads = 2}).num_kv_heads(), 2);
  auto message = [](CausalSelfAttentionOptions o) {
    try {
      CausalSelfAttention{o};
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string e = message({.dim = 24, .num_heads = 6, .num_kv_heads = 4});
  EXPECT_NE(e.find("num_heads 6 is not divisible by num_kv_heads 4"), std::string::npos) << e;
  e = message({.dim = 16, .num_heads = 4, .num_kv_heads = 8});
  EXPECT_NE(e.find("num_heads 4 is not divisible by num_kv_heads 8"), std::string::npos) << e;
  e = message({.dim = 10, .num_heads = 4, .num_kv_heads = 2});
  EXPECT_NE(e.find("dim 10 is not divisible by num_heads 4"), std::string::npos) << e;
  e = message({.dim = 16, .num_heads = 4, .num_kv_heads = -2});
  EXPECT_NE(e.find("num_kv_heads must be positive"), std::string::npos) << e;
  EXPECT_NE(e.find("-2"), std::string::npos) << e;
}

TEST(AttentionTest, RepeatKvRepeatsEachHeadInPlace) {
  // (1, 2 heads, 1, 2) -> heads a, a, a, b, b, b
  Tensor x = Tensor::from_vector(std::vector<double>{1, 2, 3, 4}, {1, 2, 1, 2});
  Tensor y = functional::repeat_kv(x, 3);
  EXPECT_EQ(y.shape(), (Shape{1, 6, 1, 2}));
  EXPECT_TRUE(y.is_contiguous());
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4}));
  EXPECT_TRUE(functional::repeat_kv(x, 1).is_same(x));  // no copy
  EXPECT_EQ(functional::repeat_kv(x, 2, 3).shape(), (Shape{1, 2, 1, 4}));
  EXPECT_THROW(functional::repeat_kv(x, 0), Error);
  EXPECT_THROW(functional::repeat_kv(x, 2, 4), Error);
  Tensor leaf = testing::randn_leaf({2, 3, 4, 2}, 11);
  EXPECT_EQ(testing::gradcheck([](const std::vector<Tensor>& in) { return functional::repeat_kv(in[0], 2, 1); }, {leaf}),
            "");
}

// A grouped-query attention is the multi-head attention with repeated wk, wv rows: float64 (the composition)
// and float32 (the fused kernels without a mask, the composition with one), each to its rounding.
TEST(AttentionTest, GroupedQueryEqualsMultiHeadWithRepeatedKeyValueHeads) {
  for (int64_t kv : {1, 2}) {
    for (DType dtype : {DType::Float64, DType::Float32}) {
      auto gqa = make_gqa(16, 4, kv, 20 + kv, dtype);
      auto mha = as_multi_head(*gqa);
      Tensor x = randn({2, 6, 16}, dtype);
      Tensor mask = Tensor::from_vector(std::vector<int64_t>{1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1}, {2, 6});
      const double tol = dtype == DType::Float64 ? 1e-13 : 1e-6;
      EXPECT_LT(max_abs_diff(gqa->forward(x), mha->forward(x)), tol) << "kv " << kv;
      EXPECT_LT(max_abs_diff(gqa->forward(x, mask), mha->forward(x, mask)), tol) << "kv " << kv;
    }
  }
}

TEST(AttentionTest, GroupedQueryGradcheck) {
  for (int64_t kv : {1, 2}) {
    auto attn = make_gqa(8, 4, kv, 30 + kv);  // head_dim 2
    Tensor x = testing::randn_leaf({2, 4, 8}, 31);
    std::vector<Tensor> inputs = {x};
    for (const Tensor& p : attn->parameters()) inputs.push_back(p);
    EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return attn->forward(in[0]); }, inputs), "")
        << "kv " << kv;
    Tensor mask = Tensor::from_vector(std::vector<int64_t>{1, 1, 1, 0, 0, 0, 1, 1}, {2, 4});  // a fully masked row
    EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return attn->forward(in[0], mask); }, inputs), "")
        << "kv " << kv;
  }
}

// float32 without a mask runs the fused kernels on the repeated heads; an all-ones mask runs the composition.
// Forward and every gradient agree to rounding.
TEST(AttentionTest, GroupedQueryFusedMatchesComposition) {
  auto fused = make_gqa(32, 4, 2, 40, DType::Float32);
  auto composed = clone_module(*fused, Device::cpu(0));
  Tensor x = randn({2, 9, 32});
  Tensor dy = randn({2, 9, 32});
  Tensor x1 = x.clone().set_requires_grad(true), x2 = x.clone().set_requires_grad(true);
  Tensor y1 = fused->forward(x1), y2 = composed->forward(x2, ones({2, 9}));
  y1.backward(dy);
  y2.backward(dy);
  // max |a - b| relative to b's scale: the two paths may sum in other orders (a few float32 ulps; measured: none).
  auto error = [](const Tensor& a, const Tensor& b) { return max_abs_diff(a, b) / max_abs(b); };
  EXPECT_LT(error(y1, y2), 1e-6);
  EXPECT_LT(error(x1.grad(), x2.grad()), 1e-6);
  StateDict g2 = composed->named_parameters();
  StateDict g1 = fused->named_parameters();
  for (size_t i = 0; i < g1.size(); ++i) EXPECT_LT(error(g1[i].second.grad(), g2[i].second.grad()), 1e-6) << g1[i].first;
}

TEST(AttentionTest, GroupedQueryPaddingAndLeftPaddedEqualsUnpadded) {
  auto attn = make_gqa(16, 4, 2, 50);
  Tensor x = randn({1, 6, 16}, DType::Float64);
  Tensor mask = Tensor::from_vector(std::vector<int64_t>{0, 0, 1, 1, 1, 1}, {1, 6});
  Tensor padded = attn->forward(x, mask);
  EXPECT_EQ(max_abs(padded.narrow(1, 0, 2)), 0.0);  // queries without a visible key
  Tensor alone = attn->forward(x.narrow(1, 2, 4).contiguous());
  EXPECT_LT(testing::max_relative_error(padded.narrow(1, 2, 4), alone), 1e-10);
}

// On a CUDA device the layer runs the fused kernels with its key/value heads in place and the padding keys hidden
// by the kernel (float32 products); on the CPU it repeats the heads and composes the padding mask. The same
// outputs and gradients to float32 sums' order, with left padding whose first queries see no key.
TEST(AttentionTest, GroupedQueryWithPaddingOnCudaMatchesTheCpu) {
  if (!dpe::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  auto cpu = make_gqa(64, 4, 2, 70, DType::Float32);
  auto cuda = clone_module(*cpu, gpu);
  const Tensor x = randn({2, 70, 64}), dy = randn({2, 70, 64});
  std::vector<int64_t> real(2 * 70, 1);
  for (int64_t t = 0; t < 5; ++t) real[static_cast<size_t>(70 + t)] = 0;  // sequence 1: 5 padding tokens first
  const Tensor mask = Tensor::from_vector(real, {2, 70});
  Tensor xc = x.clone().set_requires_grad(true), xg = x.to(gpu).set_requires_grad(true);
  Tensor yc = cpu->forward(xc, mask), yg = cuda->forward(xg, mask);
  yc.backward(dy);
  yg.backward(dy.to(gpu));
  auto error = [](const Tensor& a, const Tensor& b) { return max_abs_diff(a.to(Device::cpu(0)), b) / max_abs(b); };
  EXPECT_LT(error(yg, yc), 1e-5);
  EXPECT_EQ(max_abs(yg.to(Device::cpu(0)).narrow(0, 1, 1).narrow(1, 0, 5)), 0.0);  // no visible key
  EXPECT_LT(error(xg.grad(), xc.grad()), 1e-4);
  const StateDict gc = cpu->named_parameters(), gg = cuda->named_parameters();
  for (size_t i = 0; i < gc.size(); ++i) EXPECT_LT(error(gg[i].second.grad(), gc[i].second.grad()), 1e-4) << gc[i].first;
}

// Multi-head attention (num_kv_heads == num_heads, given or defaulted) repeats nothing: it is the plain
// composition of projections, RoPE, attention and wo, op for op, so the same bits forward and backward, on the
// fused and the masked paths.
TEST(AttentionTest, MultiHeadIsUnchangedBitForBit) {
  for (bool masked : {false, true}) {
    auto explicit_kv = make_gqa(16, 4, 4, 60, DType::Float32);
    auto defaulted = make_attention(16, 4, 60);
    defaulted->to(DType::Float32);
    Tensor x = randn({2, 5, 16});
    // Right padding: every query keeps a visible key, so the module applies no row mask after the product.
    Tensor mask = Tensor::from_vector(std::vector<int64_t>{1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {2, 5});
    // The plain multi-head composition.
    auto reference = [&](CausalSelfAttention& a, const Tensor& in) {
      const int64_t B = 2, T = 5, H = 4, hd = 4;
      functional::RotaryTables rope = functional::rotary_tables(T, hd, 10000.0, TensorOptions(DType::Float32));
      auto heads = [&](const Tensor& t) { return t.view({B, T, H, hd}).permute({0, 2, 1, 3}); };
      Tensor q = functional::apply_rotary_emb(heads(a.wq->forward(in)), rope.cos, rope.sin);
      Tensor k = functional::apply_rotary_emb(heads(a.wk->forward(in)), rope.cos, rope.sin);
      Tensor v = heads(a.wv->forward(in));
      Tensor out = masked ? scaled_dot_product_attention(
                                q, k, v, functional::attention_masks(T, mask, TensorOptions(DType::Float32)).additive)
                          : scaled_dot_product_attention(q, k, v, Tensor(), /*is_causal=*/true);
      return a.wo->forward(out.permute({0, 2, 1, 3}).reshape({B, T, 16}));
    };
    for (CausalSelfAttention* a : {explicit_kv.get(), defaulted.get()}) {
      Tensor y = masked ? a->forward(x, mask) : a->forward(x);
      Tensor dy = randn({2, 5, 16});
      y.backward(dy);
      std::vector<Tensor> grads;
      for (const Tensor& p : a->parameters()) grads.push_back(p.grad().clone());
      a->zero_grad();
      Tensor y_ref = reference(*a, x);
      y_ref.backward(dy);
      EXPECT_EQ(max_abs_diff(y, y_ref), 0.0) << "masked " << masked;
      std::vector<Tensor> params = a->parameters();
      for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(max_abs_diff(grads[i], params[i].grad()), 0.0) << i;
    }
  }
}

}  // namespace
}  // namespace dpe::nn
