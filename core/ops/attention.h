// scaled_dot_product_attention: PyTorch's torch.nn.functional.scaled_dot_product_attention (without dropout), a
// differentiable op with fused kernels for causal self-attention on CPU and CUDA devices (core/kernels/
// attention.h) and the composition of bmm, the scale, the mask and softmax everywhere else; and
// fused_causal_attention, those kernels with what a decoder adds: grouped-query heads and key padding.
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
// With is_causal, the fused kernels where fused_causal_attention_applies (below). CPU float32 with L == S,
// E == Ev and no autocast: one fused pass per (batch, head) matrix each way
// (Note [Attention one head at a time]): q, k, v read where they lie (a permuted view of heads needs no copy),
// the output written in v's layout (so that permuting it back to (..., L, heads * Ev) is a view when v was such
// a permute), the gradients in their input's, and no scores tensor but the probabilities kept for the backward.
// Elsewhere the composition; both give the same values to rounding. Differentiable in q, k and v.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask = {},
                                    bool is_causal = false, std::optional<double> scale = std::nullopt);

// The additive causal mask (L, S) of is_causal, built on the host: 0 where key j <= query i, -inf elsewhere.
Tensor causal_attention_mask(int64_t L, int64_t S, TensorOptions options = {});

// Causal self-attention in the fused kernels: q (B, H, T, E), k and v (B, Hkv, T, E), out (B, H, T, E).
//   Key j is hidden from query i when j > i or, with key_keep ((B, T) float32 on q's device, 0 for a padding
//   key), when key_keep[b, j] == 0; a query with no visible key gets a zero row and zero gradients (not NaN).
//   H % Hkv == 0: query head h attends with key/value head h / (H / Hkv) (grouped-query attention, PyTorch's
//   enable_gqa and Hugging Face's repeat_kv), read in place, never repeated.
//   scale: 1 / sqrt(E) unless given. Differentiable in q, k and v.
// CPU devices: the kernels of scaled_dot_product_attention above (Hkv == H, no key_keep, no autocast). CUDA
// devices (Note [Attention in tiles on CUDA], core/kernels/attention_cuda.cu): FlashAttention-2's tiling, no
// (T, T) tensor either way, the backward recomputing the probabilities from each query's log-sum-exp;
// deterministic. Under a CUDA autocast guard the products multiply bfloat16 or float16 operands on tensor
// cores (float32 accumulation, as bmm's under autocast); q, k, v and out stay float32. The output is (B, T, H,
// E) memory, so that permuting it to (B, T, H * E) is a view. Throws, naming the operands, where
// fused_causal_attention_applies is false.
Tensor fused_causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_keep = {},
                              std::optional<double> scale = std::nullopt);

// Whether fused_causal_attention takes these operands (with a key padding mask where key_padding), and so
// whether scaled_dot_product_attention(q, k, v, {}, true) runs fused. CUDA devices: float32 4-d operands shaped
// as above, E <= 128, B * H <= 65535, and the kernels' shared memory within the GPU's per-block limit for
// float32 or the autocast dtype (float32 fits up to E = 96 on an H100, bfloat16 and float16 to 128). A caller
// that keeps a causal mask of its own (on a GPU, where building one is a copy to the device) passes that mask
// where this is false.
bool fused_causal_attention_applies(const Tensor& q, const Tensor& k, const Tensor& v, bool key_padding = false);

}  // namespace dpe
