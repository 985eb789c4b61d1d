// Softmax and log-softmax over one axis. x, y, dy, dx are contiguous, viewed as (outer, size, inner).
// Numerically stable (max subtracted). dtype is float32 or float64.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/kernels/backend_types.h"

namespace dpe::kernels {

enum class SoftmaxKind : uint8_t { Softmax, LogSoftmax };

// y = softmax(x) or log_softmax(x) along `size`.
void softmax_cpu(SoftmaxKind kind, DType dtype, int64_t outer, int64_t size, int64_t inner, const void* x, void* y);
void softmax_cuda(cudaStream_t stream, SoftmaxKind kind, DType dtype, int64_t outer, int64_t size, int64_t inner,
                  const void* x, void* y);

// dx from the forward output y and dy:
//   softmax:     dx = y * (dy - sum(dy * y))
//   log_softmax: dx = dy - exp(y) * sum(dy)
void softmax_backward_cpu(SoftmaxKind kind, DType dtype, int64_t outer, int64_t size, int64_t inner, const void* y,
                          const void* dy, void* dx);
void softmax_backward_cuda(cudaStream_t stream, SoftmaxKind kind, DType dtype, int64_t outer, int64_t size,
                           int64_t inner, const void* y, const void* dy, void* dx);

// Cross-entropy of contiguous (rows, size) logits x against one class per row, without the log-probabilities
// (cross_entropy_mean, core/ops/loss_ops.h). Forward: loss[n] = -log_softmax(x[n])[target[n]] and valid[n] = 1,
// or 0 and 0 where target[n] == ignore_index; stats (rows, 2): each row's maximum and log of its sum of exps,
// the two numbers its log-softmax is made of. Backward: dx = log_softmax's backward (from x and stats) of the
// nll's gradient, -grad[n] at target[n] and 0 elsewhere (all 0 where ignored). Bitwise what softmax_cpu
// (LogSoftmax) then nll_forward_cpu, and nll_backward_cpu then softmax_backward_cpu, compute. Every target must
// be ignore_index or in [0, size) (checked by the caller).
void cross_entropy_rows_cpu(DType dtype, int64_t rows, int64_t size, const void* x, const int64_t* target,
                            int64_t ignore_index, void* loss, void* valid, void* stats);
void cross_entropy_rows_backward_cpu(DType dtype, int64_t rows, int64_t size, const void* x, const void* stats,
                                     const int64_t* target, int64_t ignore_index, const void* grad, void* dx);
// cross_entropy_mean's CUDA kernels (softmax_cuda.cu): reduction='mean' in two launches forward and one
// backward, where the composition takes two and two and holds the (rows, size) log-probabilities. Forward:
// stats (rows, 3) gets each row's maximum, log of its sum of exps and log-probability at its target (0 where
// ignored); count[0] the targets not ignored, out[0] the mean of their losses. Backward: dx (rows, size) from x,
// the stats and grad_out[0] / count[0]. Bit for bit softmax_cuda (LogSoftmax) then nll_mean_forward_cuda, and
// nll_mean_backward_cuda then softmax_backward_cuda. The targets live on the device.
void cross_entropy_mean_forward_cuda(cudaStream_t stream, DType dtype, int64_t rows, int64_t size, const void* x,
                                     const int64_t* target, int64_t ignore_index, void* out, void* count,
                                     void* stats);
void cross_entropy_mean_backward_cuda(cudaStream_t stream, DType dtype, int64_t rows, int64_t size, const void* x,
                                      const void* stats, const int64_t* target, int64_t ignore_index,
                                      const void* grad_out, const void* count, void* dx);

// One contiguous float32 row of `size`: exactly what softmax_cpu and softmax_backward_cpu (SoftmaxKind::Softmax,
// inner 1) compute for such a row, for fused kernels that hold rows in their own buffers (kernels/attention.h).
// y may be x, dx may be dy.
void softmax_row_cpu(int64_t size, const float* x, float* y);
void softmax_backward_row_cpu(int64_t size, const float* y, const float* dy, float* dx);

}  // namespace dpe::kernels
