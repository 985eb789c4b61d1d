// Causal scaled dot-product attention on CPU devices, float32: for each (batch, head) matrix the scores, their
// causal softmax and the weighted values in one pass over a tile that stays in cache, and the backward likewise
// (Note [Attention one head at a time] in attention_cpu.cc; the op is core/ops/attention.h).
#pragma once

#include <cstdint>

namespace dpe::kernels {

// `count` row-major float32 matrices with unit column stride: matrix i starts at data + offsets[i], its row r at
// + r * ld (a permuted view of heads is such a batch: no copy needed).
struct MatrixBatch {
  float* data = nullptr;
  const int64_t* offsets = nullptr;
  int64_t ld = 0;
};

// count matrices of T queries and T keys, of d features each; scale multiplies the scores.
struct AttentionShape {
  int64_t count = 0, T = 0, d = 0;
  double scale = 1.0;
};

// For each matrix i, with q, k, v (T, d):
//   probs[i] = softmax over keys of (q k^T * scale, -inf where key > query)   (T, T), contiguous at probs + i T T
//   out[i]   = probs[i] v                                                     (T, d)
// Rounded as the composition of those ops rounds (the product, then the scale as affine's fma, the mask as an add
// of 0 or -inf, then softmax_row_cpu of the row), so probs has the composition's bits given the same product.
// out must not overlap q, k, v or probs.
void causal_attention_forward_cpu(const AttentionShape& s, MatrixBatch q, MatrixBatch k, MatrixBatch v, float* probs,
                                  MatrixBatch out);

// From dout (T, d) per matrix and the forward's probs:
//   dv = probs^T dout;  dS = softmax backward (probs, dout v^T) * scale;  dq = dS k;  dk = dS^T q
// (the composition's backward, product by product). dq, dk, dv are written, never accumulated into, and overlap
// nothing else.
void causal_attention_backward_cpu(const AttentionShape& s, MatrixBatch q, MatrixBatch k, MatrixBatch v,
                                   const float* probs, MatrixBatch dout, MatrixBatch dq, MatrixBatch dk,
                                   MatrixBatch dv);

}  // namespace dpe::kernels
