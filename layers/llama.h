// A small Llama-style decoder: token embedding, pre-norm blocks (RMSNorm -> causal self-attention with RoPE,
// RMSNorm -> SiLU-gated MLP), final RMSNorm, output projection to logits. No biases anywhere, like Llama.
//
// Parameter names are Meta's reference Llama names, so a checkpoint of that layout loads by name:
//   tok_embeddings.weight                         (vocab, dim)
//   layers.{i}.attention_norm.weight              (dim)
//   layers.{i}.attention.{wq,wk,wv,wo}.weight     (dim, dim)
//   layers.{i}.ffn_norm.weight                    (dim)
//   layers.{i}.feed_forward.{w1,w3}.weight        (hidden_dim, dim)
//   layers.{i}.feed_forward.w2.weight             (dim, hidden_dim)
//   norm.weight                                   (dim)
//   output.weight                                 (vocab, dim)
// (tests/golden/gen_llama.py writes the same names.) See docs/LAYERS.md, "Attention and the Llama model".
#pragma once

#include <memory>
#include <vector>

#include "layers/attention.h"
#include "layers/containers.h"
#include "layers/embedding.h"
#include "layers/linear.h"
#include "layers/module.h"
#include "layers/normalization.h"

namespace dpe::nn {

// w2(silu(w1 x) * w3 x), no biases.
class LlamaMLP : public Cloneable<LlamaMLP> {
 public:
  LlamaMLP(int64_t dim, int64_t hidden_dim);

  void reset() override;
  // x: (..., dim) -> (..., dim)
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<Linear> w1, w2, w3;

 private:
  int64_t dim_;
  int64_t hidden_dim_;
};

struct TinyLlamaConfig {
  int64_t vocab_size = 0;
  int64_t dim = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t hidden_dim = 0;
  int64_t max_seq_len = 0;
  double norm_eps = 1e-6;
  double rope_theta = 10000.0;
};

// h = x + attention(attention_norm(x)); out = h + feed_forward(ffn_norm(h)).
class LlamaBlock : public Cloneable<LlamaBlock> {
 public:
  explicit LlamaBlock(const TinyLlamaConfig& config);

  void reset() override;
  // x: (B, T, dim) -> (B, T, dim)
  Tensor forward(const Tensor& x) override;
  // x: (B, T, dim)  key_padding_mask: (B, T), 1 = real token  ->  (B, T, dim)
  Tensor forward(const Tensor& x, const Tensor& key_padding_mask);

  std::shared_ptr<RMSNorm> attention_norm, ffn_norm;
  std::shared_ptr<CausalSelfAttention> attention;
  std::shared_ptr<LlamaMLP> feed_forward;

 private:
  Tensor forward_impl(const Tensor& x, const Tensor& key_padding_mask);
  TinyLlamaConfig config_;
};

class TinyLlama : public Cloneable<TinyLlama> {
 public:
  explicit TinyLlama(const TinyLlamaConfig& config);

  void reset() override;
  // tokens: (B, T) int64 in [0, vocab_size), T <= max_seq_len  ->  logits (B, T, vocab_size)
  Tensor forward(const Tensor& tokens) override;
  // tokens: (B, T)  key_padding_mask: (B, T), 1 = real token, 0 = padding  ->  logits (B, T, vocab_size)
  // Logits at padded positions are computed but meaningless: mask them out of the loss.
  Tensor forward(const Tensor& tokens, const Tensor& key_padding_mask);

  const TinyLlamaConfig& config() const { return config_; }

  std::shared_ptr<Embedding> tok_embeddings;
  std::shared_ptr<ModuleList> layers;
  std::vector<std::shared_ptr<LlamaBlock>> blocks;  // the elements of `layers`, typed
  std::shared_ptr<RMSNorm> norm;
  std::shared_ptr<Linear> output;

 private:
  Tensor forward_impl(const Tensor& tokens, const Tensor& key_padding_mask);
  TinyLlamaConfig config_;
};

}  // namespace dpe::nn
