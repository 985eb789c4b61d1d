// Causal scaled dot-product attention in fused kernels (the op is core/ops/attention.h).
// CPU devices, float32: for each (batch, head) matrix the scores, their causal softmax and the weighted values in
// one pass over a tile that stays in cache, and the backward likewise (Note [Attention one head at a time] in
// attention_cpu.cc).
// CUDA devices: FlashAttention-2's tiling (attention_cuda.cu): no (T, T) tensor either way, grouped-query heads
// read in place, an optional key padding mask, products in float32 or on tensor cores in bfloat16/float16.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/kernels/backend_types.h"

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

// ---- CUDA ----

// B sequences of T tokens in heads of d features, float32 in global memory: head h of sequence b at
// data + b * batch_stride + h * head_stride, its row t at + t * row_stride, features at unit stride. Inputs are
// only read through it.
struct AttentionHeads {
  float* data = nullptr;
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0;
};

// H query heads and Hkv key/value heads (H % Hkv == 0: query head h reads key/value head h / (H / Hkv), grouped-
// query attention without a repeated copy), d <= kAttentionCudaMaxD features each, scale multiplying the scores.
// key_keep: (B, T) float32 on the device, 0 for a padding key, or null. Key j is visible to query i when
// j <= i and key_keep[b, j] != 0. operand: the dtype the products multiply: Float32 (float32 FMAs, no tensor
// cores), BFloat16 or Float16 (q, k, v, the probabilities and the backward's dS and dout rounded to it, as
// autocast's bmm rounds its operands, on tensor cores with float32 accumulation).
struct AttentionCudaShape {
  int64_t B = 0, H = 0, Hkv = 0, T = 0, d = 0;
  double scale = 1.0;
  DType operand = DType::Float32;
  const float* key_keep = nullptr;
};

inline constexpr int64_t kAttentionCudaMaxD = 128;

// Whether the kernels for (operand, d) fit the current CUDA device's shared memory per block (the float32
// backward at d > 96 does not on an H100; the op composes instead).
bool causal_attention_cuda_fits(DType operand, int64_t d);

// out (B, H, T, d) and lse (B * H * T floats, contiguous): for each query, the log-sum-exp of its visible scaled
// scores; a query with no visible key gets out row 0 and lse -inf. Deterministic: no atomics, fixed orders.
void causal_attention_forward_cuda(cudaStream_t stream, const AttentionCudaShape& s, AttentionHeads q,
                                   AttentionHeads k, AttentionHeads v, AttentionHeads out, float* lse);

// Writes (=) dq (B, H, T, d), dk and dv (B, Hkv, T, d) from dout and the forward's out and lse; the gradients
// overlap nothing. workspace: B * H * T floats (each query's dot(dout, out)). Recomputes the probabilities
// tile by tile (FlashAttention-2's backward): one kernel for dk and dv (a block per key tile and key/value head,
// summing its group's query heads in order) and one for dq (a block per query tile), so deterministic.
void causal_attention_backward_cuda(cudaStream_t stream, const AttentionCudaShape& s, AttentionHeads q,
                                    AttentionHeads k, AttentionHeads v, AttentionHeads out, const float* lse,
                                    AttentionHeads dout, AttentionHeads dq, AttentionHeads dk, AttentionHeads dv,
                                    float* workspace);

}  // namespace dpe::kernels
