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

// One contiguous float32 row of `size`: exactly what softmax_cpu and softmax_backward_cpu (SoftmaxKind::Softmax,
// inner 1) compute for such a row, for fused kernels that hold rows in their own buffers (kernels/attention.h).
// y may be x, dx may be dy.
void softmax_row_cpu(int64_t size, const float* x, float* y);
void softmax_backward_row_cpu(int64_t size, const float* y, const float* dy, float* dx);

}  // namespace dpe::kernels
