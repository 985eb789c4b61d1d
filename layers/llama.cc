#include "layers/llama.h"

#include "core/error.h"
#include "core/ops.h"

namespace dpe::nn {

// ---- LlamaMLP ----

LlamaMLP::LlamaMLP(int64_t dim, int64_t hidden_dim) : Cloneable("LlamaMLP"), dim_(dim), hidden_dim_(hidden_dim) {
  DPE_CHECK(dim > 0 && hidden_dim > 0, "LlamaMLP(", dim, ", ", hidden_dim, "): sizes must be positive");
  reset();
}

void LlamaMLP::reset() {
  w1 = register_module("w1", std::make_shared<Linear>(dim_, hidden_dim_, /*bias=*/false));
  w2 = register_module("w2", std::make_shared<Linear>(hidden_dim_, dim_, /*bias=*/false));
  w3 = register_module("w3", std::make_shared<Linear>(dim_, hidden_dim_, /*bias=*/false));
}

Tensor LlamaMLP::forward(const Tensor& x) {
  // x: (..., dim) -> gate, up: (..., hidden_dim) -> (..., dim)
  DPE_CHECK(x.dim() >= 1 && x.size(-1) == dim_, "LlamaMLP(", dim_, ", ", hidden_dim_, "): expected x of shape (..., ",
            dim_, "), got ", shape_str(x.shape()));
  return w2->forward(silu_mul(w1->forward(x), w3->forward(x)));
}

// ---- LlamaBlock ----

LlamaBlock::LlamaBlock(const TinyLlamaConfig& config) : Cloneable("LlamaBlock"), config_(config) { reset(); }

void LlamaBlock::reset() {
  attention_norm = register_module("attention_norm", std::make_shared<RMSNorm>(config_.dim, config_.norm_eps));
  attention = register_module("attention",
                              std::make_shared<CausalSelfAttention>(config_.dim, config_.num_heads, config_.rope_theta));
  ffn_norm = register_module("ffn_norm", std::make_shared<RMSNorm>(config_.dim, config_.norm_eps));
  feed_forward = register_module("feed_forward", std::make_shared<LlamaMLP>(config_.dim, config_.hidden_dim));
}

Tensor LlamaBlock::forward(const Tensor& x) { return forward_impl(x, Tensor()); }

Tensor LlamaBlock::forward(const Tensor& x, const Tensor& key_padding_mask) {
  DPE_CHECK(key_padding_mask.defined(), "LlamaBlock: key_padding_mask is undefined (use forward(x))");
  return forward_impl(x, key_padding_mask);
}

Tensor LlamaBlock::forward_impl(const Tensor& x, const Tensor& key_padding_mask) {
  // x: (B, T, dim)  key_padding_mask: (B, T) or undefined  ->  (B, T, dim)
  Tensor normed = attention_norm->forward(x);
  Tensor h = x + (key_padding_mask.defined() ? attention->forward(normed, key_padding_mask) : attention->forward(normed));
  return h + feed_forward->forward(ffn_norm->forward(h));
}

// ---- TinyLlama ----

TinyLlama::TinyLlama(const TinyLlamaConfig& config) : Cloneable("TinyLlama"), config_(config) {
  DPE_CHECK(config.vocab_size > 0 && config.dim > 0 && config.num_layers > 0 && config.num_heads > 0 &&
                config.hidden_dim > 0 && config.max_seq_len > 0,
            "TinyLlama: every size must be positive, got vocab_size ", config.vocab_size, ", dim ", config.dim,
            ", num_layers ", config.num_layers, ", num_heads ", config.num_heads, ", hidden_dim ", config.hidden_dim,
            ", max_seq_len ", config.max_seq_len);
  reset();
}

void TinyLlama::reset() {
  tok_embeddings = register_module("tok_embeddings", std::make_shared<Embedding>(config_.vocab_size, config_.dim));
  layers = register_module("layers", std::make_shared<ModuleList>());
  blocks.clear();
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    auto block = std::make_shared<LlamaBlock>(config_);
    layers->push_back(block);
    blocks.push_back(block);
  }
  norm = register_module("norm", std::make_shared<RMSNorm>(config_.dim, config_.norm_eps));
  output = register_module("output", std::make_shared<Linear>(config_.dim, config_.vocab_size, /*bias=*/false));
}

Tensor TinyLlama::forward(const Tensor& tokens) { return forward_impl(tokens, Tensor()); }

Tensor TinyLlama::forward(const Tensor& tokens, const Tensor& key_padding_mask) {
  DPE_CHECK(key_padding_mask.defined(), "TinyLlama: key_padding_mask is undefined (use forward(tokens))");
  return forward_impl(tokens, key_padding_mask);
}

Tensor TinyLlama::forward_impl(const Tensor& tokens, const Tensor& key_padding_mask) {
  // tokens: (B, T) int64  key_padding_mask: (B, T) or undefined  ->  logits (B, T, vocab_size)
  DPE_CHECK(tokens.dim() == 2, "TinyLlama: expected tokens of shape (B, T), got ", shape_str(tokens.shape()));
  DPE_CHECK(tokens.size(1) <= config_.max_seq_len, "TinyLlama: sequence length ", tokens.size(1),
            " exceeds max_seq_len ", config_.max_seq_len);
  Tensor h = tok_embeddings->forward(tokens);  // (B, T, dim)
  for (const auto& block : blocks) h = key_padding_mask.defined() ? block->forward(h, key_padding_mask) : block->forward(h);
  return output->forward(norm->forward(h));
}

}  // namespace dpe::nn
