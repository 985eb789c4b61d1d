// Rotary position embeddings in one pass each way (core/ops/rotary.cc's apply_rotary_emb on CPU and CUDA
// devices). With h = d / 2 and, per position t of T, the tables' rows c = cos[t],
// s = sin[t]:
//   y[i]     = x[i] * c[i]         - x[i + h] * s[i]          i < h
//   y[i + h] = x[i + h] * c[i + h] + x[i] * s[i + h]
// that is x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x[h:], x[:h]); and backward, with g = dy,
//   dx[i]     = g[i] * c[i]         + g[i + h] * s[i + h]
//   dx[i + h] = g[i + h] * c[i + h] - g[i] * s[i]
// Every product is rounded, then added or subtracted (no fused multiply-add): the composition's roundings, so
// both give the same numbers (up to the sign of a zero).
//
// Operands: the strided layout's sizes are (..., T, d) (at least two dims, d even and > 0) and its last stride is
// 1; its other strides are anything (attention's heads, a permuted view, are read where they lie). The forward
// reads x through x_layout and writes y contiguous; the backward reads dy contiguous and writes dx through
// dx_layout, which must not overlap itself (the op passes x's strides where they are dense: the permutation
// back is then free). cos and sin are contiguous (T, d). dtype (float32 or float64) is every operand's. Rows
// are independent: the same bits on any thread count, and on CUDA (rotary_emb_cuda.cu).
#pragma once

#include "core/dtype.h"
#include "core/kernels/backend_types.h"
#include "core/kernels/layout.h"

namespace dpe::kernels {

void rotary_emb_forward_cpu(DType dtype, const Layout& x_layout, const void* x, const void* cos, const void* sin,
                            void* y);

void rotary_emb_backward_cpu(DType dtype, const Layout& dx_layout, const void* dy, const void* cos, const void* sin,
                             void* dx);

void rotary_emb_forward_cuda(cudaStream_t stream, DType dtype, const Layout& x_layout, const void* x,
                             const void* cos, const void* sin, void* y);

void rotary_emb_backward_cuda(cudaStream_t stream, DType dtype, const Layout& dx_layout, const void* dy,
                              const void* cos, const void* sin, void* dx);

}  // namespace dpe::kernels
