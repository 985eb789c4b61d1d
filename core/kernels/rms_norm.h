// RMSNorm in one pass each way (core/ops/norm.cc's rms_norm on CPU and CUDA devices). x, y, dy and dx are
// contiguous (rows, d); weight and dweight are (d) or null; rstd is (rows). dtype (float32 or float64) is every
// operand's.
//
// Per row:  rstd = 1 / sqrt(mean(x^2) + eps),  xhat = x * rstd,  y = xhat * weight   (y = xhat without one)
// with the composition's roundings (xhat rounded before the weight multiplies it); mean(x^2) is a sum over the
// row in eight fixed lanes, then divided by d.
// Backward, with g = dy * weight (dy without one):
//   dx = rstd * (g - xhat * sum(g * xhat) / d)          dweight = sum over rows of dy * xhat
// dweight's sum runs over fixed blocks of rows, their partial sums added in block order: the same bits for any
// thread count (core/kernels/cpu_parallel.h's contract). The CUDA kernels (rms_norm_cuda.cu) keep these
// roundings and fixed orders, with the row sums in double.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/kernels/backend_types.h"

namespace dpe::kernels {

// Writes y (rows, d) and rstd (rows).
void rms_norm_forward_cpu(DType dtype, int64_t rows, int64_t d, const void* x, const void* weight, double eps,
                          void* y, void* rstd);

// Writes dx (rows, d) and dweight (d) where they are not null (=, not +=). rstd: the forward's.
void rms_norm_backward_cpu(DType dtype, int64_t rows, int64_t d, const void* x, const void* weight,
                           const void* rstd, const void* dy, void* dx, void* dweight);

// The same on `stream`. The backward's dweight needs a workspace of rms_norm_backward_cuda_workspace(rows, d)
// elements of dtype on the device (its blocks' partial sums); null when dweight is.
void rms_norm_forward_cuda(cudaStream_t stream, DType dtype, int64_t rows, int64_t d, const void* x,
                           const void* weight, double eps, void* y, void* rstd);
int64_t rms_norm_backward_cuda_workspace(int64_t rows, int64_t d);
void rms_norm_backward_cuda(cudaStream_t stream, DType dtype, int64_t rows, int64_t d, const void* x,
                            const void* weight, const void* rstd, const void* dy, void* dx, void* dweight,
                            void* workspace);

}  // namespace dpe::kernels
