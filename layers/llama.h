// A Llama-style decoder with Hugging Face / Meta Llama semantics: token embedding, pre-norm blocks (RMSNorm ->
// causal self-attention with RoPE, multi-head or grouped-query, RMSNorm -> SiLU-gated MLP), final RMSNorm,
// output projection to logits. No biases anywhere, like Llama.
//
// Parameter names are Meta's reference Llama names, so a checkpoint of that layout loads by name:
//   tok_embeddings.weight                         (vocab, dim)
//   layers.{i}.attention_norm.weight              (dim)
//   layers.{i}.attention.{wq,wo}.weight           (dim, dim)
//   layers.{i}.attention.{wk,wv}.weight           (kv_heads * head_dim, dim), head_dim = dim / num_heads
//   layers.{i}.ffn_norm.weight                    (dim)
//   layers.{i}.feed_forward.{w1,w3}.weight        (hidden_dim, dim)
//   layers.{i}.feed_forward.w2.weight             (dim, hidden_dim)
//   norm.weight                                   (dim)
//   output.weight                                 (vocab, dim), absent when tie_embeddings
// (tests/golden/gen_llama.py writes the same names.) With tie_embeddings the output projection is
// tok_embeddings.weight itself: one tensor, registered once, receiving both uses' gradients; there is no
// output.weight parameter or state_dict entry (a checkpoint of a tied model that stores output.weight too, as
// Hugging Face's state_dict() does, loads after dropping that key, or with strict = false).
// See docs/LAYERS.md, "Attention and the Llama model".
#pragma once

#include <memory>
#include <optional>
#include <string>
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

// The model's sizes and initialisation; the Hugging Face LlamaConfig field each one is, in brackets.
struct LlamaConfig {
  int64_t vocab_size = 0;       // (vocab_size)
  int64_t dim = 0;              // (hidden_size); dim % num_heads == 0, head_dim = dim / num_heads even
  int64_t num_layers = 0;       // (num_hidden_layers)
  int64_t num_heads = 0;        // query heads (num_attention_heads)
  int64_t hidden_dim = 0;       // the SwiGLU MLP's width (intermediate_size)
  int64_t max_seq_len = 0;      // the longest sequence forward accepts (max_position_embeddings)
  double norm_eps = 1e-6;       // (rms_norm_eps)
  double rope_theta = 10000.0;  // (rope_theta)
  // Key/value heads (num_key_value_heads): 0 means num_heads, multi-head attention; fewer is grouped-query
  // attention, num_heads % num_kv_heads == 0 (layers/attention.h).
  int64_t num_kv_heads = 0;
  // The output projection is tok_embeddings.weight (tie_word_embeddings); see the file comment.
  bool tie_embeddings = false;
  // Set: every Linear and Embedding weight ~ N(0, init_std) (initializer_range; GPT-2 and Llama use 0.02), the
  // RMSNorm weights 1. Unset: each layer's PyTorch default (Linear U(-1/sqrt(in), 1/sqrt(in)), Embedding
  // N(0, 1)), the default; the "tiny" preset keeps it.
  std::optional<double> init_std = std::nullopt;

  int64_t kv_heads() const { return num_kv_heads == 0 ? num_heads : num_kv_heads; }
  int64_t head_dim() const { return num_heads > 0 ? dim / num_heads : 0; }
};
using TinyLlamaConfig = LlamaConfig;

// Throws dpe::Error naming the value and what was expected when a field of `config` cannot build a Llama:
// sizes positive (num_kv_heads >= 0), dim % num_heads == 0, an even head_dim, num_heads % num_kv_heads == 0,
// norm_eps >= 0, rope_theta > 0, init_std finite and positive when set.
void check_llama_config(const LlamaConfig& config);

// Named sizes. vocab_size 0 takes the preset's own vocabulary; any other must be positive.
//   tiny   dim 128, 2 layers, 4 heads (MHA), hidden 384, max_seq_len 64, vocab 259 (the byte-level corpus,
//          data/text_corpus.h), layers' default initialisation: models/models.h's tiny-llama, exactly.
//   small  dim 768, 12 layers, 12 heads, 3 key/value heads (GQA, groups of 4), hidden 3072, max_seq_len 512,
//          vocab 32000 (Llama 2's tokenizer), untied, init_std 0.02.
//   124m   dim 768, 12 layers, 12 heads (MHA), hidden 3072, max_seq_len 1024, vocab 50304 (GPT-2's 50257
//          padded to a multiple of 128, as llm.c), tied embeddings, init_std 0.02: the GPT-2 124M shape with
//          Llama's blocks (its SwiGLU MLP has three matrices, so it holds ~152M parameters, not 124M).
// An unknown name throws, listing the presets.
inline const std::vector<std::string> kLlamaPresetNames = {"tiny", "small", "124m"};
LlamaConfig llama_preset(const std::string& name, int64_t vocab_size = 0);

// Sizes for throughput and MFU. Formula (PaLM, appendix B; llm.c's train_gpt2):
//   train_flops_per_token = 6 * non_embedding_params + 12 * num_layers * dim * seq_len
// 6 N: a multiply-add (2 FLOPs) per parameter of a matrix product per token forward, twice that backward (the
// input's and the weight's gradients). 12 L d T: the attention scores q k^T and their product with v, each
// 2 T d FLOPs per token and layer forward (whole T x T matrices: the causal half is not subtracted), times 3.
// Independent of num_kv_heads: grouped-query attention shrinks wk and wv (and N), not the score products.
struct LlamaSize {
  int64_t num_params = 0;  // every parameter, the tied matrix once: the sum over Llama(config).parameters()
  // num_params less the token lookup table (vocab * dim) when untied: the parameters in a product per token
  // (RMSNorm gains included, as llm.c counts its layernorms). Tied, the table is the output projection and
  // counts.
  int64_t non_embedding_params = 0;
  double train_flops_per_token = 0;
};
// seq_len: the training sequence length, in [1, max_seq_len]; 0 means max_seq_len. Checks the config.
LlamaSize llama_size(const LlamaConfig& config, int64_t seq_len = 0);

// h = x + attention(attention_norm(x)); out = h + feed_forward(ffn_norm(h)).
class LlamaBlock : public Cloneable<LlamaBlock> {
 public:
  explicit LlamaBlock(const LlamaConfig& config);

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
  LlamaConfig config_;
};

class Llama : public Cloneable<Llama> {
 public:
  // Checks the config (check_llama_config). Weights from cpu:0's default generator, in registration order.
  explicit Llama(const LlamaConfig& config);

  void reset() override;
  // tokens: (B, T) int64 in [0, vocab_size), T <= max_seq_len  ->  logits (B, T, vocab_size)
  Tensor forward(const Tensor& tokens) override;
  // tokens: (B, T)  key_padding_mask: (B, T), 1 = real token, 0 = padding  ->  logits (B, T, vocab_size)
  // Logits at padded positions are computed but meaningless: mask them out of the loss.
  Tensor forward(const Tensor& tokens, const Tensor& key_padding_mask);

  const LlamaConfig& config() const { return config_; }
  // The output projection's weight (vocab, dim): output->weight, or tok_embeddings->weight when tied.
  const Tensor& output_weight() const;
  // Activation checkpointing per block (layers/checkpoint.h): with grad mode on, each block keeps only its
  // input and runs its forward again in the backward. Off by default; clones keep it.
  void set_activation_checkpointing(bool on) { activation_checkpointing_ = on; }
  bool activation_checkpointing() const { return activation_checkpointing_; }

  std::shared_ptr<Embedding> tok_embeddings;
  std::shared_ptr<ModuleList> layers;
  std::vector<std::shared_ptr<LlamaBlock>> blocks;  // the elements of `layers`, typed
  std::shared_ptr<RMSNorm> norm;
  std::shared_ptr<Linear> output;  // null when config().tie_embeddings

 private:
  Tensor forward_impl(const Tensor& tokens, const Tensor& key_padding_mask);
  LlamaConfig config_;
  bool activation_checkpointing_ = false;
};
using TinyLlama = Llama;

}  // namespace dpe::nn
