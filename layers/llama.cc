#include "layers/llama.h"

#include <cmath>

#include "core/error.h"
#include "core/ops.h"
#include "layers/checkpoint.h"
#include "layers/init.h"

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

// ---- LlamaConfig ----

void check_llama_config(const LlamaConfig& c) {
  DPE_CHECK(c.vocab_size > 0 && c.dim > 0 && c.num_layers > 0 && c.num_heads > 0 && c.hidden_dim > 0 &&
                c.max_seq_len > 0,
            "Llama: every size must be positive, got vocab_size ", c.vocab_size, ", dim ", c.dim, ", num_layers ",
            c.num_layers, ", num_heads ", c.num_heads, ", hidden_dim ", c.hidden_dim, ", max_seq_len ", c.max_seq_len);
  DPE_CHECK(c.num_kv_heads >= 0, "Llama: num_kv_heads must be positive (or 0 for num_heads ", c.num_heads, "), got ",
            c.num_kv_heads);
  DPE_CHECK(c.dim % c.num_heads == 0, "Llama: dim ", c.dim, " is not divisible by num_heads ", c.num_heads);
  DPE_CHECK(c.head_dim() % 2 == 0, "Llama: head_dim ", c.head_dim(), " (dim ", c.dim, " / num_heads ", c.num_heads,
            ") must be even for rotary embeddings");
  DPE_CHECK(c.num_heads % c.kv_heads() == 0, "Llama: num_heads ", c.num_heads, " is not divisible by num_kv_heads ",
            c.kv_heads(), " (each group of query heads shares one key/value head)");
  DPE_CHECK(std::isfinite(c.norm_eps) && c.norm_eps >= 0, "Llama: norm_eps must be finite and >= 0, got ", c.norm_eps);
  DPE_CHECK(std::isfinite(c.rope_theta) && c.rope_theta > 0, "Llama: rope_theta must be finite and positive, got ",
            c.rope_theta);
  DPE_CHECK(!c.init_std || (std::isfinite(*c.init_std) && *c.init_std > 0),
            "Llama: init_std must be finite and positive when set, got ", c.init_std.value_or(0.0));
}

LlamaConfig llama_preset(const std::string& name, int64_t vocab_size) {
  DPE_CHECK(vocab_size >= 0, "llama_preset('", name, "'): vocab_size must be positive (or 0 for the preset's own), got ",
            vocab_size);
  LlamaConfig c;
  if (name == "tiny") {
    c = {.vocab_size = 259, .dim = 128, .num_layers = 2, .num_heads = 4, .hidden_dim = 384, .max_seq_len = 64};
  } else if (name == "small") {
    c = {.vocab_size = 32000, .dim = 768, .num_layers = 12, .num_heads = 12, .hidden_dim = 3072, .max_seq_len = 512,
         .num_kv_heads = 3, .init_std = 0.02};
  } else if (name == "124m") {
    c = {.vocab_size = 50304, .dim = 768, .num_layers = 12, .num_heads = 12, .hidden_dim = 3072, .max_seq_len = 1024,
         .num_kv_heads = 12, .tie_embeddings = true, .init_std = 0.02};
  } else {
    DPE_CHECK(false, "unknown Llama preset '", name, "'; expected tiny, small or 124m");
  }
  if (vocab_size > 0) c.vocab_size = vocab_size;
  return c;
}

LlamaSize llama_size(const LlamaConfig& c, int64_t seq_len) {
  check_llama_config(c);
  DPE_CHECK(seq_len >= 0 && seq_len <= c.max_seq_len, "llama_size: seq_len ", seq_len, " must be in [1, max_seq_len ",
            c.max_seq_len, "] (or 0 for max_seq_len)");
  const int64_t T = seq_len == 0 ? c.max_seq_len : seq_len;
  const int64_t table = c.vocab_size * c.dim;
  const int64_t kv_dim = c.kv_heads() * c.head_dim();
  const int64_t per_layer = 2 * c.dim                          // attention_norm, ffn_norm
                            + 2 * c.dim * c.dim + 2 * kv_dim * c.dim  // wq, wo; wk, wv
                            + 3 * c.hidden_dim * c.dim;              // w1, w2, w3
  LlamaSize size;
  size.num_params = table + c.num_layers * per_layer + c.dim + (c.tie_embeddings ? 0 : table);
  size.non_embedding_params = size.num_params - (c.tie_embeddings ? 0 : table);
  size.train_flops_per_token = 6.0 * static_cast<double>(size.non_embedding_params) +
                               12.0 * static_cast<double>(c.num_layers) * static_cast<double>(c.dim) *
                                   static_cast<double>(T);
  return size;
}

// ---- LlamaBlock ----

LlamaBlock::LlamaBlock(const LlamaConfig& config) : Cloneable("LlamaBlock"), config_(config) { reset(); }

void LlamaBlock::reset() {
  attention_norm = register_module("attention_norm", std::make_shared<RMSNorm>(config_.dim, config_.norm_eps));
  attention = register_module("attention", std::make_shared<CausalSelfAttention>(CausalSelfAttentionOptions{
                                               .dim = config_.dim,
                                               .num_heads = config_.num_heads,
                                               .num_kv_heads = config_.num_kv_heads,
                                               .rope_theta = config_.rope_theta}));
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

// ---- Llama ----

Llama::Llama(const LlamaConfig& config) : Cloneable("Llama"), config_(config) {
  check_llama_config(config_);
  reset();
}

void Llama::reset() {
  tok_embeddings = register_module("tok_embeddings", std::make_shared<Embedding>(config_.vocab_size, config_.dim));
  layers = register_module("layers", std::make_shared<ModuleList>());
  blocks.clear();
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    auto block = std::make_shared<LlamaBlock>(config_);
    layers->push_back(block);
    blocks.push_back(block);
  }
  norm = register_module("norm", std::make_shared<RMSNorm>(config_.dim, config_.norm_eps));
  // Tied: the output projection is tok_embeddings.weight, used by forward directly (not a second registration).
  output = config_.tie_embeddings
               ? nullptr
               : register_module("output", std::make_shared<Linear>(config_.dim, config_.vocab_size, /*bias=*/false));
  if (config_.init_std) {
    // Every Linear and Embedding weight, in registration order; the RMSNorm weights stay 1.
    const double init_std = *config_.init_std;
    init::normal_(tok_embeddings->weight, 0.0, init_std);
    for (const auto& block : blocks) {
      for (const auto& layer : {block->attention->wq, block->attention->wk, block->attention->wv, block->attention->wo,
                                block->feed_forward->w1, block->feed_forward->w2, block->feed_forward->w3}) {
        init::normal_(layer->weight, 0.0, init_std);
      }
    }
    if (output) init::normal_(output->weight, 0.0, init_std);
  }
}

const Tensor& Llama::output_weight() const { return output ? output->weight : tok_embeddings->weight; }

Tensor Llama::forward(const Tensor& tokens) { return forward_impl(tokens, Tensor()); }

Tensor Llama::forward(const Tensor& tokens, const Tensor& key_padding_mask) {
  DPE_CHECK(key_padding_mask.defined(), "Llama: key_padding_mask is undefined (use forward(tokens))");
  return forward_impl(tokens, key_padding_mask);
}

Tensor Llama::forward_impl(const Tensor& tokens, const Tensor& key_padding_mask) {
  // tokens: (B, T) int64  key_padding_mask: (B, T) or undefined  ->  logits (B, T, vocab_size)
  DPE_CHECK(tokens.dim() == 2, "Llama: expected tokens of shape (B, T), got ", shape_str(tokens.shape()));
  DPE_CHECK(tokens.size(1) <= config_.max_seq_len, "Llama: sequence length ", tokens.size(1),
            " exceeds max_seq_len ", config_.max_seq_len);
  Tensor h = tok_embeddings->forward(tokens);  // (B, T, dim)
  for (const auto& block : blocks) {
    auto run = [block = block.get(), key_padding_mask](const std::vector<Tensor>& x) {
      return key_padding_mask.defined() ? block->forward(x[0], key_padding_mask) : block->forward(x[0]);
    };
    h = activation_checkpointing_ ? checkpoint(*block, run, {h}) : run({h});
  }
  h = norm->forward(h);
  return output ? output->forward(h) : linear(h, tok_embeddings->weight);  // (B, T, vocab_size)
}

}  // namespace dpe::nn
