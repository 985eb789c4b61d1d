#include "layers/llama.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops.h"
#include "layers/loss.h"
#include "tests/testing/golden.h"
#include "tests/testing/gradcheck.h"

namespace dpe::nn {
namespace {

// The model of tests/golden/gen_llama.py.
TinyLlamaConfig golden_config() {
  TinyLlamaConfig c;
  c.vocab_size = 16;
  c.dim = 16;
  c.num_layers = 2;
  c.num_heads = 2;
  c.hidden_dim = 24;
  c.max_seq_len = 8;
  return c;
}

Tensor tokens_of(const std::vector<int64_t>& values, const Shape& shape) { return Tensor::from_vector(values, shape); }

TEST(LlamaTest, ShapesAndNames) {
  TinyLlama model(golden_config());
  Tensor tokens = tokens_of({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {2, 5});
  EXPECT_EQ(model.forward(tokens).shape(), (Shape{2, 5, 16}));
  EXPECT_EQ(model.forward(tokens, ones({2, 5})).shape(), (Shape{2, 5, 16}));
  std::vector<std::string> names;
  for (const auto& [name, t] : model.state_dict()) names.push_back(name);
  std::vector<std::string> expected = {"tok_embeddings.weight"};
  for (std::string i : {"0", "1"}) {
    std::string p = "layers." + i + ".";
    for (std::string n : {"attention_norm.weight", "attention.wq.weight", "attention.wk.weight", "attention.wv.weight",
                          "attention.wo.weight", "ffn_norm.weight", "feed_forward.w1.weight", "feed_forward.w2.weight",
                          "feed_forward.w3.weight"})
      expected.push_back(p + n);
  }
  expected.push_back("norm.weight");
  expected.push_back("output.weight");
  EXPECT_EQ(names, expected);
  EXPECT_THROW(model.forward(tokens_of(std::vector<int64_t>(9, 0), {1, 9})), Error);  // > max_seq_len
  EXPECT_THROW(model.forward(tokens_of({1, 2}, {2})), Error);
  TinyLlamaConfig bad = golden_config();
  bad.num_heads = 3;
  EXPECT_THROW(TinyLlama{bad}, Error);
}

TEST(LlamaTest, MlpIsGatedSilu) {
  LlamaMLP mlp(2, 1);
  {
    NoGradGuard no_grad;
    mlp.w1->weight.copy_(Tensor::from_vector(std::vector<float>{1, 0}, {1, 2}));
    mlp.w3->weight.copy_(Tensor::from_vector(std::vector<float>{0, 1}, {1, 2}));
    mlp.w2->weight.copy_(Tensor::from_vector(std::vector<float>{1, 2}, {2, 1}));
  }
  // x = (2, 3): silu(2) * 3 = 2 / (1 + e^-2) * 3
  double h = 2.0 / (1.0 + std::exp(-2.0)) * 3.0;
  std::vector<float> y = mlp.forward(Tensor::from_vector(std::vector<float>{2, 3}, {1, 2})).to_vector<float>();
  EXPECT_NEAR(y[0], h, 1e-5);
  EXPECT_NEAR(y[1], 2 * h, 1e-5);
}

TEST(LlamaTest, IsCausal) {
  manual_seed(0);
  TinyLlama model(golden_config());
  std::vector<int64_t> a = {3, 1, 4, 1, 5, 9, 2, 6};
  Tensor logits = model.forward(tokens_of(a, {1, 8}));
  for (int64_t t = 0; t < 7; ++t) {
    std::vector<int64_t> b = a;
    for (int64_t j = t + 1; j < 8; ++j) b[j] = (b[j] + 7) % 16;
    Tensor logits2 = model.forward(tokens_of(b, {1, 8}));
    EXPECT_LT(max_abs_diff(logits.narrow(1, 0, t + 1), logits2.narrow(1, 0, t + 1)), 1e-6) << "t = " << t;
    EXPECT_GT(max_abs_diff(logits.narrow(1, t + 1, 1), logits2.narrow(1, t + 1, 1)), 1e-4) << "t = " << t;
  }
}

TEST(LlamaTest, PaddingDoesNotAffectRealTokens) {
  manual_seed(1);
  TinyLlama model(golden_config());
  model.to(DType::Float64);
  // Left padding by 3 (any token ids at the padded positions).
  Tensor mask = tokens_of({0, 0, 0, 1, 1, 1, 1, 1}, {1, 8});
  Tensor a = model.forward(tokens_of({0, 0, 0, 5, 6, 7, 8, 9}, {1, 8}), mask).narrow(1, 3, 5);
  Tensor b = model.forward(tokens_of({11, 12, 13, 5, 6, 7, 8, 9}, {1, 8}), mask).narrow(1, 3, 5);
  EXPECT_LT(max_abs_diff(a, b), 1e-12);
  // RoPE is relative: the real tokens see what they would see alone.
  Tensor alone = model.forward(tokens_of({5, 6, 7, 8, 9}, {1, 5}));
  EXPECT_LT(testing::max_relative_error(a, alone), 1e-9);
  // Without the mask the padded tokens leak in (the checks above can fail).
  Tensor leak = model.forward(tokens_of({11, 12, 13, 5, 6, 7, 8, 9}, {1, 8})).narrow(1, 3, 5);
  EXPECT_GT(max_abs_diff(a, leak), 1e-4);
}

TEST(LlamaTest, BlockGradcheck) {
  TinyLlamaConfig c;
  c.dim = 4;
  c.num_heads = 2;
  c.hidden_dim = 6;
  manual_seed(2);
  LlamaBlock block(c);
  block.to(DType::Float64);
  {
    NoGradGuard no_grad;  // RMSNorm gains away from 1 so their gradients are exercised
    block.attention_norm->weight.copy_(testing::randn_leaf({4}, 9).detach());
    block.ffn_norm->weight.copy_(testing::randn_leaf({4}, 10).detach());
  }
  Tensor x = testing::randn_leaf({2, 3, 4}, 7);
  std::vector<Tensor> inputs = {x};
  for (const Tensor& p : block.parameters()) inputs.push_back(p);
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return block.forward(in[0]); }, inputs), "");
  Tensor mask = tokens_of({0, 1, 1, 1, 1, 0}, {2, 3});
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return block.forward(in[0], mask); }, inputs), "");
}

TEST(LlamaTest, CloneIsEqual) {
  manual_seed(3);
  TinyLlama model(golden_config());
  auto copy = clone_module(model, Device::cpu(1));
  Tensor tokens = tokens_of({1, 2, 3, 4}, {1, 4});
  EXPECT_EQ(copy->blocks.size(), 2u);
  EXPECT_LT(max_abs_diff(copy->forward(tokens.to(Device::cpu(1))).to(Device::cpu(0)), model.forward(tokens)), 1e-7);
}

// Loads the fixture's weights (float32) into a model of `dtype`, runs forward with the mask and backward
// with the fixture's dlogits, and compares logits and every parameter gradient.
// Error measure: elementwise relative (max |a - e| / (|e| + 1e-6)) when `scale_relative` is false; else
// max |a - e| / max |e|, the error relative to the tensor's scale.
double error_of(const Tensor& actual, const Tensor& expected, bool scale_relative) {
  if (!scale_relative) return testing::max_relative_error(actual, expected);
  return max_abs_diff(actual, expected.to(actual.dtype())) / max_abs_diff(expected, zeros_like(expected));
}

void check_against_pytorch(DType dtype, const std::string& tag, double tolerance, bool scale_relative) {
  testing::Golden g = testing::load_golden("llama");  // tests/golden/gen_llama.py
  TinyLlama model(golden_config());
  model.to(dtype);
  StateDict state;
  for (const auto& [name, t] : model.state_dict()) state.emplace_back(name, g.tensor("p." + name));
  model.load_state_dict(state);
  Tensor logits = model.forward(g.tensor("tokens"), g.tensor("mask"));
  logits.backward(g.tensor("dlogits").to(dtype));
  EXPECT_LT(error_of(logits, g.tensor("logits_" + tag), scale_relative), tolerance);
  for (const auto& [name, p] : model.named_parameters())
    EXPECT_LT(error_of(p.grad(), g.tensor("g_" + tag + "." + name), scale_relative), tolerance) << name;
  NoGradGuard no_grad;
  EXPECT_LT(error_of(model.forward(g.tensor("tokens")), g.tensor("logits_nomask_" + tag), scale_relative), tolerance);
}

TEST(LlamaTest, MatchesPyTorchFloat64) { check_against_pytorch(DType::Float64, "f64", 1e-10, false); }

// float64 above checks the algorithm; float32 checks the float32 path. Summation orders differ from
// PyTorch's through two blocks of GEMMs and reductions, and small gradient entries are sums of cancelling
// terms, so the elementwise relative error of those entries reaches ~4e-4 while the error relative to each
// tensor's scale stays below ~8e-7 (measured): bound the latter by 1e-5.
TEST(LlamaTest, MatchesPyTorchFloat32) { check_against_pytorch(DType::Float32, "f32", 1e-5, true); }

// ---- grouped-query attention, presets, sizes, tied embeddings, initialisation ----

// The grouped-query model of tests/golden/gen_llama.py (llama_gqa.golden).
LlamaConfig gqa_golden_config() {
  return {.vocab_size = 16, .dim = 32, .num_layers = 2, .num_heads = 4, .hidden_dim = 40, .max_seq_len = 8,
          .num_kv_heads = 2};
}

std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// Loads the fixture's float32 weights into a model of `dtype`; forward with the padding mask, the next-token
// loss (padding targets ignored), its backward; compares logits, loss and every parameter gradient with
// PyTorch's float64 values, and the logits without the mask.
void check_gqa_against_pytorch(DType dtype, double tolerance, bool scale_relative) {
  testing::Golden g = testing::load_golden("llama_gqa");  // tests/golden/gen_llama.py
  Llama model(gqa_golden_config());
  model.to(dtype);
  StateDict state;
  for (const auto& [name, t] : model.state_dict()) state.emplace_back(name, g.tensor("p." + name));
  model.load_state_dict(state);
  Tensor logits = model.forward(g.tensor("tokens"), g.tensor("mask"));
  Tensor loss = functional::cross_entropy(logits.reshape({-1, 16}), g.tensor("targets").reshape({-1}),
                                          {.ignore_index = -100});
  loss.backward();
  EXPECT_LT(error_of(logits, g.tensor("logits_f64"), scale_relative), tolerance);
  EXPECT_LT(testing::max_relative_error(loss, g.tensor("loss_f64")), tolerance);
  for (const auto& [name, p] : model.named_parameters())
    EXPECT_LT(error_of(p.grad(), g.tensor("g_f64." + name), scale_relative), tolerance) << name;
  NoGradGuard no_grad;  // float32: the fused attention kernels on the repeated heads
  EXPECT_LT(error_of(model.forward(g.tensor("tokens")), g.tensor("logits_nomask_f64"), scale_relative), tolerance);
}

TEST(LlamaTest, GroupedQueryMatchesPyTorchFloat64) { check_gqa_against_pytorch(DType::Float64, 1e-10, false); }

// float32 against PyTorch's float64: float32 rounding through two blocks, bounded relative to each tensor's
// scale as in MatchesPyTorchFloat32.
TEST(LlamaTest, GroupedQueryMatchesPyTorchFloat32) { check_gqa_against_pytorch(DType::Float32, 1e-5, true); }

TEST(LlamaTest, GroupedQueryShapesAndNames) {
  Llama model(gqa_golden_config());
  EXPECT_EQ(model.blocks[0]->attention->num_kv_heads(), 2);
  StateDict state = model.state_dict();
  EXPECT_EQ(state.size(), 1 + 2 * 9 + 2u);
  for (const auto& [name, t] : state) {
    bool kv = name.find("attention.wk") != std::string::npos || name.find("attention.wv") != std::string::npos;
    if (kv) {
      EXPECT_EQ(t.shape(), (Shape{16, 32})) << name;  // 2 key/value heads of 8
    }
  }
  EXPECT_EQ(model.forward(tokens_of({1, 2, 3, 4, 5, 6}, {2, 3})).shape(), (Shape{2, 3, 16}));
}

TEST(LlamaTest, GroupedQueryBlockGradcheck) {
  LlamaConfig c{.dim = 8, .num_heads = 4, .hidden_dim = 6, .num_kv_heads = 2};
  manual_seed(12);
  LlamaBlock block(c);
  block.to(DType::Float64);
  Tensor x = testing::randn_leaf({2, 3, 8}, 13);
  std::vector<Tensor> inputs = {x};
  for (const Tensor& p : block.parameters()) inputs.push_back(p);
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return block.forward(in[0]); }, inputs), "");
  Tensor mask = tokens_of({0, 1, 1, 1, 1, 0}, {2, 3});
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return block.forward(in[0], mask); }, inputs), "");
}

// num_kv_heads == num_heads (given, or 0 for the default) is the multi-head model: the same parameters from the
// same seed and the same bits out, forward and backward (layers/attention_test.cc checks the attention op for
// op against the plain multi-head composition).
TEST(LlamaTest, MultiHeadKvHeadsGiveBitIdenticalResults) {
  LlamaConfig given = golden_config();
  given.num_kv_heads = given.num_heads;
  manual_seed(14);
  Llama a(golden_config());
  manual_seed(14);
  Llama b(given);
  Tensor tokens = tokens_of({3, 1, 4, 1, 5, 9, 2, 6}, {2, 4});
  Tensor mask = tokens_of({1, 1, 1, 1, 0, 1, 1, 1}, {2, 4});
  for (bool masked : {false, true}) {
    a.zero_grad();
    b.zero_grad();
    Tensor la = masked ? a.forward(tokens, mask) : a.forward(tokens);
    Tensor lb = masked ? b.forward(tokens, mask) : b.forward(tokens);
    EXPECT_EQ(max_abs_diff(la, lb), 0.0);
    sum(la * la).backward();
    sum(lb * lb).backward();
    StateDict pa = a.named_parameters(), pb = b.named_parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_EQ(max_abs_diff(pa[i].second, pb[i].second), 0.0) << pa[i].first;
      EXPECT_EQ(max_abs_diff(pa[i].second.grad(), pb[i].second.grad()), 0.0) << pa[i].first;
    }
  }
}

TEST(LlamaTest, ConfigErrorsNameTheValues) {
  auto build = [](LlamaConfig c) { return error_message([&] { Llama{c}; }); };
  LlamaConfig c = gqa_golden_config();
  c.num_kv_heads = 3;
  EXPECT_NE(build(c).find("num_heads 4 is not divisible by num_kv_heads 3"), std::string::npos) << build(c);
  c.num_kv_heads = -1;
  EXPECT_NE(build(c).find("num_kv_heads must be positive (or 0 for num_heads 4), got -1"), std::string::npos)
      << build(c);
  c = gqa_golden_config();
  c.num_heads = 3;
  c.num_kv_heads = 0;
  EXPECT_NE(build(c).find("dim 32 is not divisible by num_heads 3"), std::string::npos) << build(c);
  c = gqa_golden_config();
  c.num_heads = 16;  // head_dim 2: fine; 32 heads would give head_dim 1
  c.num_kv_heads = 0;
  EXPECT_EQ(build(c), "no error");
  c.num_heads = 32;
  EXPECT_NE(build(c).find("head_dim 1"), std::string::npos) << build(c);
  c = gqa_golden_config();
  c.vocab_size = 0;
  EXPECT_NE(build(c).find("vocab_size 0"), std::string::npos) << build(c);
  c = gqa_golden_config();
  c.init_std = -0.5;
  EXPECT_NE(build(c).find("init_std must be finite and positive when set, got -0.5"), std::string::npos) << build(c);
  c = gqa_golden_config();
  c.rope_theta = 0;
  EXPECT_NE(build(c).find("rope_theta"), std::string::npos) << build(c);
}

TEST(LlamaTest, Presets) {
  LlamaConfig tiny = llama_preset("tiny");
  EXPECT_EQ(tiny.vocab_size, 259);
  EXPECT_EQ(tiny.dim, 128);
  EXPECT_EQ(tiny.num_layers, 2);
  EXPECT_EQ(tiny.num_heads, 4);
  EXPECT_EQ(tiny.kv_heads(), 4);
  EXPECT_EQ(tiny.hidden_dim, 384);
  EXPECT_EQ(tiny.max_seq_len, 64);
  EXPECT_FALSE(tiny.init_std.has_value());
  EXPECT_FALSE(tiny.tie_embeddings);
  EXPECT_EQ(tiny.norm_eps, 1e-6);
  EXPECT_EQ(tiny.rope_theta, 10000.0);

  LlamaConfig small = llama_preset("small", 259);
  EXPECT_EQ(small.vocab_size, 259);
  EXPECT_EQ(small.dim, 768);
  EXPECT_EQ(small.num_layers, 12);
  EXPECT_EQ(small.num_heads, 12);
  EXPECT_EQ(small.num_kv_heads, 3);
  EXPECT_EQ(small.hidden_dim, 3072);
  EXPECT_EQ(small.max_seq_len, 512);
  EXPECT_EQ(small.init_std.value_or(0.0), 0.02);
  EXPECT_EQ(llama_preset("small").vocab_size, 32000);

  LlamaConfig m124 = llama_preset("124m");
  EXPECT_EQ(m124.vocab_size, 50304);
  EXPECT_EQ(m124.dim, 768);
  EXPECT_EQ(m124.num_layers, 12);
  EXPECT_EQ(m124.num_heads, 12);
  EXPECT_EQ(m124.kv_heads(), 12);
  EXPECT_EQ(m124.hidden_dim, 3072);
  EXPECT_EQ(m124.max_seq_len, 1024);
  EXPECT_TRUE(m124.tie_embeddings);
  EXPECT_EQ(m124.init_std.value_or(0.0), 0.02);
  EXPECT_EQ(llama_preset("124m", 259).vocab_size, 259);
  for (const std::string& name : kLlamaPresetNames) EXPECT_NO_THROW(check_llama_config(llama_preset(name)));

  std::string e = error_message([] { llama_preset("7b"); });
  EXPECT_NE(e.find("unknown Llama preset '7b'; expected tiny, small or 124m"), std::string::npos) << e;
  e = error_message([] { llama_preset("tiny", -5); });
  EXPECT_NE(e.find("vocab_size must be positive (or 0 for the preset's own), got -5"), std::string::npos) << e;
}

int64_t parameter_count(const Module& m) {
  int64_t n = 0;
  for (const Tensor& p : m.parameters()) n += p.numel();
  return n;
}

TEST(LlamaTest, SizesAndFlops) {
  // Counted by hand for the presets. 124m (tied): 12 layers of 2*768 + 4*768^2 + 3*768*3072, the final norm's
  // 768 and the 50304 x 768 table, which is also the output projection.
  const int64_t layer124 = 2 * 768 + 4 * 768 * 768 + 3 * 768 * 3072;
  LlamaSize s = llama_size(llama_preset("124m"));
  EXPECT_EQ(s.num_params, 12 * layer124 + 768 + 50304 * 768);
  EXPECT_EQ(s.num_params, 151898880);
  EXPECT_EQ(s.non_embedding_params, s.num_params);
  EXPECT_DOUBLE_EQ(s.train_flops_per_token, 6.0 * 151898880 + 12.0 * 12 * 768 * 1024);
  // small (untied, 3 key/value heads: wk, wv are 192 x 768), at its max_seq_len and at 256.
  const int64_t layer_small = 2 * 768 + 2 * 768 * 768 + 2 * 192 * 768 + 3 * 768 * 3072;
  LlamaSize small = llama_size(llama_preset("small", 259));
  EXPECT_EQ(small.num_params, 12 * layer_small + 768 + 2 * 259 * 768);
  EXPECT_EQ(small.non_embedding_params, small.num_params - 259 * 768);
  EXPECT_DOUBLE_EQ(small.train_flops_per_token, 6.0 * small.non_embedding_params + 12.0 * 12 * 768 * 512);
  EXPECT_DOUBLE_EQ(llama_size(llama_preset("small", 259), 256).train_flops_per_token,
                   6.0 * small.non_embedding_params + 12.0 * 12 * 768 * 256);
  // The count is the model's: multi-head, grouped-query, tied.
  for (LlamaConfig c : {golden_config(), gqa_golden_config(), llama_preset("tiny")}) {
    for (bool tied : {false, true}) {
      c.tie_embeddings = tied;
      EXPECT_EQ(llama_size(c).num_params, parameter_count(Llama(c))) << c.dim << " tied " << tied;
    }
  }
  std::string e = error_message([] { llama_size(llama_preset("tiny"), 65); });
  EXPECT_NE(e.find("seq_len 65 must be in [1, max_seq_len 64]"), std::string::npos) << e;
  e = error_message([] { llama_size(llama_preset("tiny"), -1); });
  EXPECT_NE(e.find("seq_len -1"), std::string::npos) << e;
}

// Tied: output.weight is tok_embeddings.weight, registered once; its gradient is the sum of the lookup's and
// the projection's, the untied model's two gradients added (float64, same weights).
TEST(LlamaTest, TiedEmbeddings) {
  LlamaConfig c = gqa_golden_config();
  c.tie_embeddings = true;
  manual_seed(15);
  Llama tied(c);
  tied.to(DType::Float64);
  EXPECT_TRUE(tied.output == nullptr);
  EXPECT_TRUE(tied.output_weight().is_same(tied.tok_embeddings->weight));
  std::vector<std::string> names;
  for (const auto& [name, t] : tied.state_dict()) names.push_back(name);
  EXPECT_EQ(names.back(), "norm.weight");  // no output.weight
  EXPECT_EQ(std::count(names.begin(), names.end(), "tok_embeddings.weight"), 1);

  c.tie_embeddings = false;
  Llama untied(c);
  untied.to(DType::Float64);
  StateDict state = tied.state_dict();
  state.emplace_back("output.weight", tied.tok_embeddings->weight.detach());
  untied.load_state_dict(state);

  Tensor tokens = tokens_of({3, 1, 4, 1, 5, 9, 2, 6, 5, 3}, {2, 5});
  Tensor mask = tokens_of({1, 1, 1, 1, 1, 0, 1, 1, 1, 1}, {2, 5});
  Tensor lt = tied.forward(tokens, mask), lu = untied.forward(tokens, mask);
  EXPECT_EQ(max_abs_diff(lt, lu), 0.0);
  Tensor dlogits = randn(lt.shape(), DType::Float64);
  lt.backward(dlogits);
  lu.backward(dlogits);
  Tensor both = untied.tok_embeddings->weight.grad() + untied.output->weight.grad();
  EXPECT_LT(testing::max_relative_error(tied.tok_embeddings->weight.grad(), both), 1e-12);

  // Clones and moves keep the tie.
  auto copy = clone_module(tied, Device::cpu(1));
  EXPECT_TRUE(copy->output_weight().is_same(copy->tok_embeddings->weight));
  EXPECT_EQ(copy->state_dict().size(), tied.state_dict().size());
  EXPECT_LT(max_abs_diff(copy->forward(tokens.to(Device::cpu(1))).to(Device::cpu(0)), tied.forward(tokens)), 1e-12);
}

TEST(LlamaTest, InitStd) {
  LlamaConfig c = gqa_golden_config();
  c.vocab_size = 64;
  c.hidden_dim = 128;
  c.init_std = 0.02;
  manual_seed(16);
  Llama model(c);
  for (const auto& [name, p] : model.named_parameters()) {
    std::vector<double> v = p.to_vector<double>();
    if (name.find("norm.weight") != std::string::npos) {
      for (double x : v) EXPECT_EQ(x, 1.0) << name;
      continue;
    }
    double mean = 0, sq = 0;
    for (double x : v) mean += x;
    mean /= static_cast<double>(v.size());
    for (double x : v) sq += (x - mean) * (x - mean);
    double std = std::sqrt(sq / static_cast<double>(v.size()));
    // >= 512 draws each: the sample std of N(0, 0.02) is within 15% with overwhelming probability.
    EXPECT_NEAR(std, 0.02, 0.003) << name;
    EXPECT_NEAR(mean, 0.0, 0.003) << name;
  }
  // Unset: the layers' defaults (Embedding N(0, 1), Linear U(-1/sqrt(in), 1/sqrt(in))).
  c.init_std.reset();
  manual_seed(16);
  Llama defaults(c);
  std::vector<double> emb = defaults.tok_embeddings->weight.to_vector<double>();
  EXPECT_GT(*std::max_element(emb.begin(), emb.end()), 1.0);
  std::vector<double> wq = defaults.blocks[0]->attention->wq->weight.to_vector<double>();
  for (double x : wq) EXPECT_LE(std::abs(x), 1.0 / std::sqrt(32.0));
}

}  // namespace
}  // namespace dpe::nn
