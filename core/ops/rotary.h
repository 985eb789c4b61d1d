// Rotary position embeddings (RoPE, as Llama applies them to queries and keys): a differentiable op with a fused
// kernel on CPU devices (core/kernels/rotary_emb.h: one pass each way, x read where it lies, nothing of x kept
// for the backward) and a composition of tensor ops elsewhere, and wherever cos or sin requires grad.
#pragma once

#include "core/tensor.h"

namespace dpe {

// x: (..., T, d)  cos, sin: (T, d)  ->  (..., T, d), contiguous
// y = x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[..., d/2:], x[..., :d/2]) along the last dim
// (the tables broadcast over x's leading dims). d must be even; x may be any view (attention's heads are a
// permuted one); cos and sin have x's dtype and device. Differentiable in x, and in cos and sin.
Tensor apply_rotary_emb(const Tensor& x, const Tensor& cos, const Tensor& sin);

}  // namespace dpe
