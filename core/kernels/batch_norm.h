// Batch normalisation's four passes (PyTorch's batch_norm_stats, batch_norm_elemt, batch_norm_backward_reduce
// and batch_norm_backward_elemt), so that a BatchNorm layer reads its activations twice forward and twice
// backward instead of once per elementwise op of the composed formula (core/ops/norm.cc).
//
// Layout: x, y, dy, dx are contiguous (N, C, S) (S: the product of the spatial dims, 1 for (N, C) input);
// channel c's M = N * S values are x[n, c, s] for every n and s. Per-channel vectors (mean, var, invstd,
// weight, bias, sum_dy, sum_dy_xmu) are contiguous (C). Every pointer has dtype `dtype`: float32 or float64.
// weight and bias may be null (1 and 0).
//
// Numerics: per-channel sums accumulate in double in a fixed order (CPU: planes in n order, each plane's mean
// and squared deviations combined by Chan's update; CUDA: fixed pieces of each channel, each a fixed-shape
// tree, merged in piece order, Note [Batch-norm reductions on CUDA]), so results do not depend on the thread
// count or the GPU. The variance is the mean of squared deviations from the mean
// (two passes' accuracy, no E[x^2] - E[x]^2 cancellation).
// Aliasing: y may be x, dx may be dy (each element is read before it is written); nothing else may overlap.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/kernels/backend_types.h"

namespace dpe::kernels {

struct BatchNormShape {
  DType dtype = DType::Float32;
  int64_t n = 0, c = 0, s = 0;
  // CPU only: x, y, dy, dx are channels last, (N, S, C) in memory (Note [Memory formats], core/tensor.h). The
  // sums then run over fixed blocks of rows of C values, merged in block order: still independent of the
  // thread count, but not the same bits as the NCHW order's.
  bool channels_last = false;
};

// What the statistics pass writes besides mean and var, per channel c, where given (null: not written):
//   invstd[c]       = 1 / sqrt(var[c] + eps)
//   running_mean[c] = (1 - momentum) * running_mean[c] + momentum * mean[c]              (training's update,
//   running_var[c]  = (1 - momentum) * running_var[c] + momentum * var[c] * M / (M - 1)   PyTorch's; M > 1)
// in dtype from mean[c] and var[c] as stored, each update rounded as the tensor ops it replaces round it
// (the scaled buffer, then one fma), so the bits are those of the ops; and once (with channel 0, so C > 0)
//   *num_batches_tracked += 1                                                            (an int64)
// On a GPU that saves nine launches per BatchNorm forward. running_mean and running_var come together.
// Aliasing: none with x, mean or var.
struct BatchNormStatsExtras {
  void* invstd = nullptr;
  double eps = 0;
  void* running_mean = nullptr;
  void* running_var = nullptr;
  double momentum = 0;
  int64_t* num_batches_tracked = nullptr;
};

// mean[c] = sum over (n, s) of x / M;  var[c] = sum of (x - mean[c])^2 / M (biased). Needs M > 0.
void batch_norm_stats_cpu(const BatchNormShape& shape, const void* x, void* mean, void* var,
                          const BatchNormStatsExtras& extras = {});
void batch_norm_stats_cuda(cudaStream_t stream, const BatchNormShape& shape, const void* x, void* mean, void* var,
                           const BatchNormStatsExtras& extras = {});

// y = (x - mean[c]) * invstd[c] * weight[c] + bias[c].
void batch_norm_elemt_cpu(const BatchNormShape& shape, const void* x, const void* mean, const void* invstd,
                          const void* weight, const void* bias, void* y);
void batch_norm_elemt_cuda(cudaStream_t stream, const BatchNormShape& shape, const void* x, const void* mean,
                           const void* invstd, const void* weight, const void* bias, void* y);

// sum_dy[c] = sum of dy;  sum_dy_xmu[c] = sum of dy * (x - mean[c]).  (weight's gradient is
// sum_dy_xmu * invstd, bias's is sum_dy.)
void batch_norm_backward_reduce_cpu(const BatchNormShape& shape, const void* dy, const void* x, const void* mean,
                                    void* sum_dy, void* sum_dy_xmu);
void batch_norm_backward_reduce_cuda(cudaStream_t stream, const BatchNormShape& shape, const void* dy, const void* x,
                                     const void* mean, void* sum_dy, void* sum_dy_xmu);

// sum_dy[c] = sum of dy alone: batch_norm_backward_reduce's first sum, one read of dy, which is also a
// convolution's bias gradient (core/ops/conv.cc). CUDA only: on the CPU, sum() over {0, 2, 3} is one pass per
// plane already; on a GPU that sum is two generic reductions, the first reading dy at 300 GB/s on an H100.
void channel_sum_cuda(cudaStream_t stream, const BatchNormShape& shape, const void* dy, void* sum_dy);

// The input gradient. batch_stats (the forward normalised with this batch's mean and variance, which depend
// on x):  dx = (dy - sum_dy/M - (x - mean) * invstd^2 * sum_dy_xmu/M) * invstd * weight.
// Otherwise (running statistics, constants):  dx = dy * invstd * weight; x, mean, sum_dy, sum_dy_xmu unused
// (may be null).
void batch_norm_backward_elemt_cpu(const BatchNormShape& shape, bool batch_stats, const void* dy, const void* x,
                                   const void* mean, const void* invstd, const void* weight, const void* sum_dy,
                                   const void* sum_dy_xmu, void* dx);
void batch_norm_backward_elemt_cuda(cudaStream_t stream, const BatchNormShape& shape, bool batch_stats,
                                    const void* dy, const void* x, const void* mean, const void* invstd,
                                    const void* weight, const void* sum_dy, const void* sum_dy_xmu, void* dx);

}  // namespace dpe::kernels
