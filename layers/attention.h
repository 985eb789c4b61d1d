// Causal self-attention with rotary position embeddings (RoPE) and an optional key padding mask, as in Llama
// (no biases), multi-head or grouped-query. See docs/LAYERS.md, "Attention and the Llama model".
//
// Grouped-query attention (GQA, Hugging Face Llama's num_key_value_heads): num_heads query heads and
// num_kv_heads key/value heads, num_heads % num_kv_heads == 0; query head h reads key/value head
// h / (num_heads / num_kv_heads), i.e. each group of consecutive query heads shares one key/value head (HF's
// repeat_kv). num_kv_heads == num_heads is multi-head attention; num_kv_heads == 1 is multi-query attention.
// wk and wv are (num_kv_heads * head_dim, dim).
//
// Rotary convention: HF Llama's "rotate_half" (GPT-NeoX) layout. For head_dim d and frequency
// inv_freq[i] = theta^(-2i/d), i < d/2, element i of a head is rotated together with element i + d/2:
//   rope(x)[t] = x[t] * cos[t] + rotate_half(x[t]) * sin[t]
//   rotate_half(x) = cat(-x[d/2:], x[:d/2]),  cos[t] = cat(cos(t inv_freq), cos(t inv_freq)), same for sin.
// Positions are 0..T-1 whatever the padding; RoPE scores depend only on position differences, so a
// left-padded sequence attends like the unpadded one (up to rounding). Tables are computed in double on the
// host and cast to x's dtype (HF computes them in float32; the golden script uses double, like dpe).
//
// Masks: key j is visible to query i iff j <= i and key_padding_mask[b, j] != 0. Masked scores get -inf
// before the softmax. A query row with no visible key (a padded query in a left-padded sequence) outputs
// zeros and passes zero gradient, never NaN (PyTorch's SDPA gives NaN there).
// The softmax runs in x's compute dtype (float32 or float64; storage types must be cast first, as everywhere).
#pragma once

#include <memory>

#include "core/ops/rotary.h"
#include "layers/linear.h"
#include "layers/module.h"

namespace dpe::nn {

namespace functional {

struct RotaryTables {
  Tensor cos;  // (T, head_dim)
  Tensor sin;  // (T, head_dim)
};

// cos/sin tables for positions 0..seq_len-1 (see the file comment), in `options`' dtype and device.
RotaryTables rotary_tables(int64_t seq_len, int64_t head_dim, double theta, TensorOptions options = {});

// x: (..., T, head_dim)  cos, sin: (T, head_dim)  ->  (..., T, head_dim) (core/ops/rotary.h: one fused pass
// each way on CPU devices).
using dpe::apply_rotary_emb;

// The additive attention mask and the row mask described in the file comment, built on the host.
//   key_padding_mask: (B, T) any dtype, nonzero = real token; may be undefined (causal only).
//   additive: (B, 1, T, T), or (T, T) without a padding mask: 0 where visible, -inf where masked; a row
//             with no visible key is all 0 (its softmax is finite and then zeroed by `keep`).
//   keep:     (B, 1, T, 1) 1 for rows with a visible key, else 0; undefined when every row has one.
struct AttentionMasks {
  Tensor additive;
  Tensor keep;
};
AttentionMasks attention_masks(int64_t T, const Tensor& key_padding_mask, TensorOptions options = {});

// Hugging Face's repeat_kv: each key/value head repeated n_rep times in place, so that query head h meets
// key/value head h / n_rep.  x: (..., KV, ...) with the heads at `heads_dim`  ->  the same with KV * n_rep heads,
// contiguous: one broadcasting view and one copy (x itself when n_rep == 1). Differentiable: the backward sums
// each group's gradients into its head.
Tensor repeat_kv(const Tensor& x, int64_t n_rep, int64_t heads_dim = 1);

}  // namespace functional

struct CausalSelfAttentionOptions {
  int64_t dim = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // 0: num_heads (multi-head attention)
  double rope_theta = 10000.0;
};

class CausalSelfAttention : public Cloneable<CausalSelfAttention> {
 public:
  // Multi-head attention (num_kv_heads = num_heads).
  CausalSelfAttention(int64_t dim, int64_t num_heads, double rope_theta = 10000.0);
  // Checks dim > 0, num_heads > 0, 0 <= num_kv_heads, dim % num_heads == 0, num_heads % num_kv_heads == 0, an
  // even head_dim and rope_theta > 0, each error naming the values.
  explicit CausalSelfAttention(CausalSelfAttentionOptions options);

  void reset() override;
  // x: (B, T, dim) -> (B, T, dim); causal mask only.
  Tensor forward(const Tensor& x) override;
  // x: (B, T, dim)  key_padding_mask: (B, T), 1 = real token, 0 = padding (any dtype, any device; read on
  // the host)  ->  (B, T, dim)
  Tensor forward(const Tensor& x, const Tensor& key_padding_mask);

  int64_t dim() const { return dim_; }
  int64_t num_heads() const { return num_heads_; }
  int64_t num_kv_heads() const { return num_kv_heads_; }
  int64_t head_dim() const { return dim_ / num_heads_; }
  double rope_theta() const { return rope_theta_; }

  // Projections, no bias: names "wq", "wk", "wv", "wo" in the state dict (Meta's Llama names).
  //   wq: (dim, dim)  wk, wv: (num_kv_heads * head_dim, dim)  wo: (dim, dim)
  std::shared_ptr<Linear> wq, wk, wv, wo;

 private:
  Tensor forward_impl(const Tensor& x, const Tensor& key_padding_mask);
  const functional::RotaryTables& tables_for(int64_t T, const Tensor& x);
  const Tensor& causal_mask_for(int64_t T, const Tensor& x);

  int64_t dim_;
  int64_t num_heads_;
  int64_t num_kv_heads_;
  double rope_theta_;
  // Caches of the last RoPE tables and causal mask (keyed by length, dtype, device), built on the host and
  // copied to the device once rather than every step; a module is used by one thread at a time.
  functional::RotaryTables tables_;
  int64_t tables_len_ = -1;
  Tensor causal_mask_;
};

}  // namespace dpe::nn
