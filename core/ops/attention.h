// scaled_dot_product_attention: PyTorch's torch.nn.functional.scaled_dot_product_attention (without dropout), a
// differentiable op with fused CPU kernels for causal self-attention (core/kernels/attention.h) and the
// composition of bmm, the scale, the mask and softmax everywhere else.
#pragma once

#include <optional>

#include "core/tensor.h"

namespace dpe {

// q: (..., L, E)  k: (..., S, E)  v: (..., S, Ev)  ->  (..., L, Ev); the leading dims the same for all three (no
// broadcasting between them), one dtype (float32 or float64) and device.
//   scores = q @ k^T * scale (scale: 1 / sqrt(E) unless given), + attn_mask where given (additive, q's dtype and
//   device, broadcastable to (..., L, S); -inf hides a key), or with is_causal key j hidden from query i when
//   j > i (PyTorch's top-left alignment; attn_mask and is_causal together are an error, as in PyTorch);
//   out = softmax(scores, -1) @ v. A query whose every key is hidden gives NaN, as PyTorch's composition does.
// CPU float32 with is_causal, L == S, E == Ev and no autocast: one fused pass per (batch, head) matrix each way
// (Note [Attention one head at a time]): q, k, v read where they lie (a permuted view of heads needs no copy),
// the output written in v's layout (so that permuting it back to (..., L, heads * Ev) is a view when v was such
// a permute), the gradients in their input's, and no scores tensor but the probabilities kept for the backward.
// Elsewhere the composition; both give the same values to rounding. Differentiable in q, k and v.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask = {},
                                    bool is_causal = false, std::optional<double> scale = std::nullopt);

// The additive causal mask (L, S) of is_causal, built on the host: 0 where key j <= query i, -inf elsewhere.
Tensor causal_attention_mask(int64_t L, int64_t S, TensorOptions options = {});

// Whether scaled_dot_product_attention(q, k, v, {}, true) runs the fused CPU kernels (see above). A caller that
// keeps a causal mask of its own (on a GPU, where building one is a copy to the device) passes that mask where
// this is false.
bool fused_causal_attention_applies(const Tensor& q, const Tensor& k, const Tensor& v);

}  // namespace dpe
