#include "layers/attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/ops.h"
#include "core/ops/attention.h"

namespace dpe::nn {

namespace functional {

RotaryTables rotary_tables(int64_t seq_len, int64_t head_dim, double theta, TensorOptions options) {
  // cos, sin: (T, head_dim); column i and i + head_dim/2 share the frequency theta^(-2i/head_dim).
  DPE_CHECK(seq_len >= 0 && head_dim > 0 && head_dim % 2 == 0, "rotary_tables: need seq_len >= 0 and an even head_dim > 0, got seq_len ",
            seq_len, ", head_dim ", head_dim);
  DPE_CHECK(theta > 0, "rotary_tables: theta must be positive, got ", theta);
  const int64_t half = head_dim / 2;
  std::vector<double> c(static_cast<size_t>(seq_len * head_dim)), s(c.size());
  for (int64_t i = 0; i < half; ++i) {
    double inv_freq = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));
    for (int64_t t = 0; t < seq_len; ++t) {
      double angle = static_cast<double>(t) * inv_freq;
      c[t * head_dim + i] = c[t * head_dim + i + half] = std::cos(angle);
      s[t * head_dim + i] = s[t * head_dim + i + half] = std::sin(angle);
    }
  }
  TensorOptions opts = options.with_requires_grad(false);
  return {Tensor::from_vector(c, {seq_len, head_dim}, opts), Tensor::from_vector(s, {seq_len, head_dim}, opts)};
}

AttentionMasks attention_masks(int64_t T, const Tensor& key_padding_mask, TensorOptions options) {
  // key_padding_mask: (B, T) or undefined  ->  additive: (B, 1, T, T) or (T, T); keep: (B, 1, T, 1) or undefined
  const double neg_inf = -std::numeric_limits<double>::infinity();
  TensorOptions opts = options.with_requires_grad(false);
  if (!key_padding_mask.defined()) return {causal_attention_mask(T, T, opts), Tensor()};
  DPE_CHECK(key_padding_mask.dim() == 2 && key_padding_mask.size(1) == T,
            "attention_masks: expected key_padding_mask of shape (B, ", T, "), got ",
            shape_str(key_padding_mask.shape()));
  const int64_t B = key_padding_mask.size(0);
  std::vector<double> real = key_padding_mask.to_vector<double>();
  std::vector<double> add(static_cast<size_t>(B * T * T), 0.0), keep(static_cast<size_t>(B * T), 1.0);
  bool all_rows_kept = true;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < T; ++i) {
      double* row = add.data() + (b * T + i) * T;
      bool any_visible = false;
      for (int64_t j = 0; j < T; ++j) {
        bool visible = j <= i && real[b * T + j] != 0.0;
        row[j] = visible ? 0.0 : neg_inf;
        any_visible = any_visible || visible;
      }
      if (!any_visible) {
        // No visible key: a finite row (softmax stays finite), zeroed afterwards by `keep`.
        std::fill(row, row + T, 0.0);
        keep[b * T + i] = 0.0;
        all_rows_kept = false;
      }
    }
  }
  AttentionMasks masks;
  masks.additive = Tensor::from_vector(add, {B, 1, T, T}, opts);
  if (!all_rows_kept) masks.keep = Tensor::from_vector(keep, {B, 1, T, 1}, opts);
  return masks;
}

Tensor repeat_kv(const Tensor& x, int64_t n_rep, int64_t heads_dim) {
  // x: (..., KV, ...) -> view (..., KV, n_rep, ...) with stride 0 over n_rep -> copy (..., KV * n_rep, ...)
  DPE_CHECK(n_rep >= 1, "repeat_kv: n_rep must be at least 1, got ", n_rep);
  const int64_t d = normalize_dim(heads_dim, x.dim(), "repeat_kv");
  if (n_rep == 1) return x;
  Shape expanded = x.shape();
  expanded.insert(expanded.begin() + d + 1, n_rep);
  Shape merged = x.shape();
  merged[d] *= n_rep;
  // contiguous() before the view: reshape alone would return the stride-0 view itself where it can express it
  // (one head: (1, n_rep) merges), and the kernels write gradients in their inputs' layouts.
  return x.unsqueeze(d + 1).expand(expanded).contiguous().view(merged);
}

}  // namespace functional

CausalSelfAttention::CausalSelfAttention(int64_t dim, int64_t num_heads, double rope_theta)
    : CausalSelfAttention(CausalSelfAttentionOptions{.dim = dim, .num_heads = num_heads, .rope_theta = rope_theta}) {}

CausalSelfAttention::CausalSelfAttention(CausalSelfAttentionOptions options)
    : Cloneable("CausalSelfAttention"),
      dim_(options.dim),
      num_heads_(options.num_heads),
      num_kv_heads_(options.num_kv_heads == 0 ? options.num_heads : options.num_kv_heads),
      rope_theta_(options.rope_theta) {
  DPE_CHECK(dim_ > 0 && num_heads_ > 0, "CausalSelfAttention(dim ", dim_, ", num_heads ", num_heads_,
            "): dim and num_heads must be positive");
  DPE_CHECK(options.num_kv_heads >= 0, "CausalSelfAttention: num_kv_heads must be positive (or 0 for num_heads ",
            num_heads_, "), got ", options.num_kv_heads);
  DPE_CHECK(dim_ % num_heads_ == 0, "CausalSelfAttention: dim ", dim_, " is not divisible by num_heads ", num_heads_);
  DPE_CHECK(num_heads_ % num_kv_heads_ == 0, "CausalSelfAttention: num_heads ", num_heads_,
            " is not divisible by num_kv_heads ", num_kv_heads_,
            " (each group of query heads shares one key/value head)");
  DPE_CHECK((dim_ / num_heads_) % 2 == 0, "CausalSelfAttention: head_dim ", dim_ / num_heads_, " (dim ", dim_,
            " / num_heads ", num_heads_, ") must be even for rotary embeddings");
  DPE_CHECK(rope_theta_ > 0, "CausalSelfAttention: rope_theta must be positive, got ", rope_theta_);
  reset();
}

void CausalSelfAttention::reset() {
  const int64_t kv_dim = num_kv_heads_ * head_dim();
  wq = register_module("wq", std::make_shared<Linear>(dim_, dim_, /*bias=*/false));
  wk = register_module("wk", std::make_shared<Linear>(dim_, kv_dim, /*bias=*/false));
  wv = register_module("wv", std::make_shared<Linear>(dim_, kv_dim, /*bias=*/false));
  wo = register_module("wo", std::make_shared<Linear>(dim_, dim_, /*bias=*/false));
  tables_ = {};
  tables_len_ = -1;
  causal_mask_ = Tensor();
}

Tensor CausalSelfAttention::forward(const Tensor& x) { return forward_impl(x, Tensor()); }

Tensor CausalSelfAttention::forward(const Tensor& x, const Tensor& key_padding_mask) {
  DPE_CHECK(key_padding_mask.defined(), "CausalSelfAttention: key_padding_mask is undefined (use forward(x))");
  return forward_impl(x, key_padding_mask);
}

const functional::RotaryTables& CausalSelfAttention::tables_for(int64_t T, const Tensor& x) {
  if (tables_len_ != T || tables_.cos.dtype() != x.dtype() || tables_.cos.device() != x.device()) {
    tables_ = functional::rotary_tables(T, head_dim(), rope_theta_, TensorOptions(x.dtype()).with_device(x.device()));
    tables_len_ = T;
  }
  return tables_;
}

namespace {

// key_padding_mask (B, T), any dtype and device, nonzero = real token  ->  fused_causal_attention's key_keep:
// float32 1 or 0 on x's device, made on the host (attention_masks reads the mask there too).
Tensor key_keep_for(const Tensor& key_padding_mask, const Tensor& x) {
  std::vector<double> keep = key_padding_mask.to_vector<double>();
  for (double& k : keep) k = k != 0.0 ? 1.0 : 0.0;
  return Tensor::from_vector(keep, key_padding_mask.shape(), TensorOptions(DType::Float32).with_device(x.device()));
}

}  // namespace

const Tensor& CausalSelfAttention::causal_mask_for(int64_t T, const Tensor& x) {
  if (!causal_mask_.defined() || causal_mask_.size(0) != T || causal_mask_.dtype() != x.dtype() ||
      causal_mask_.device() != x.device()) {
    causal_mask_ = functional::attention_masks(T, Tensor(), TensorOptions(x.dtype()).with_device(x.device())).additive;
  }
  return causal_mask_;
}

Tensor CausalSelfAttention::forward_impl(const Tensor& x, const Tensor& key_padding_mask) {
  // x: (B, T, dim)  key_padding_mask: (B, T) or undefined  ->  (B, T, dim)
  DPE_CHECK(x.dim() == 3 && x.size(2) == dim_, "CausalSelfAttention(dim ", dim_, ", heads ", num_heads_,
            "): expected x of shape (B, T, ", dim_, "), got ", shape_str(x.shape()));
  const int64_t B = x.size(0), T = x.size(1), H = num_heads_, hd = head_dim();
  if (key_padding_mask.defined()) {
    DPE_CHECK(key_padding_mask.shape() == (Shape{B, T}), "CausalSelfAttention: key_padding_mask must be (B, T) = [", B,
              ", ", T, "] for x ", shape_str(x.shape()), ", got ", shape_str(key_padding_mask.shape()));
  }
  const functional::RotaryTables& rope = tables_for(T, x);
  const int64_t KV = num_kv_heads_, n_rep = H / KV;

  // (B, T, heads * hd) -> (B, T, heads, hd) -> (B, heads, T, hd), views
  auto heads = [&](const Tensor& t, int64_t n) { return t.view({B, T, n, hd}).permute({0, 2, 1, 3}); };
  Tensor q = functional::apply_rotary_emb(heads(wq->forward(x), H), rope.cos, rope.sin);  // (B, H, T, hd)
  Tensor k = functional::apply_rotary_emb(heads(wk->forward(x), KV), rope.cos, rope.sin);  // (B, KV, T, hd)
  Tensor v_proj = wv->forward(x);                                                          // (B, T, KV * hd)
  Tensor v = heads(v_proj, KV);                                                            // (B, KV, T, hd)
  const bool padded = key_padding_mask.defined();
  Tensor out;  // (B, H, T, hd): softmax over the keys of the scaled, masked scores, times v
  if (fused_causal_attention_applies(q, k, v, padded)) {
    // The fused kernels (core/ops/attention.h): on CUDA they read each key/value head for its group of query
    // heads in place and hide the padding keys themselves; on CPU they take this branch without GQA or padding.
    // Either way they write the output in (B, T, H, hd) memory, so the permute back below is a view.
    out = fused_causal_attention(q, k, v, padded ? key_keep_for(key_padding_mask, x) : Tensor());
  } else {
    if (n_rep > 1) {
      // Note [Grouped-query attention by repetition]: the CPU kernels and the composition take one key/value
      // head per query head, so each of the KV heads is repeated n_rep times (HF's repeat_kv), after RoPE
      // (applied to KV heads, not H). k: (B, KV, T, hd) -> (B, H, T, hd), one copy. v is repeated in its
      // projection's (B, T, KV, hd) layout -> (B, T, H, hd), one copy, then permuted as a view, so that the
      // fused CPU kernels write the output in (B, T, H, hd) memory and the permute back below stays a view, as
      // without GQA. The CUDA kernels read head h / n_rep in place instead, which saves these two copies (2 B
      // T H hd elements written and kept alive for the backward) and the backward's sum of each group's
      // gradients.
      k = functional::repeat_kv(k, n_rep, /*heads_dim=*/1);
      v = functional::repeat_kv(v_proj.view({B, T, KV, hd}), n_rep, /*heads_dim=*/2).permute({0, 2, 1, 3});
    }
    if (padded) {
      functional::AttentionMasks masks =
          functional::attention_masks(T, key_padding_mask, TensorOptions(x.dtype()).with_device(x.device()));
      out = scaled_dot_product_attention(q, k, v, masks.additive);
      if (masks.keep.defined()) out = out * masks.keep;  // rows without a visible key -> 0
    } else if (fused_causal_attention_applies(q, k, v)) {
      out = scaled_dot_product_attention(q, k, v, Tensor(), /*is_causal=*/true);
    } else {
      out = scaled_dot_product_attention(q, k, v, causal_mask_for(T, x));  // the device keeps its mask
    }
  }
  // (B, H, T, hd) -> (B, T, H*hd)
  return wo->forward(out.permute({0, 2, 1, 3}).reshape({B, T, dim_}));
}

}  // namespace dpe::nn
