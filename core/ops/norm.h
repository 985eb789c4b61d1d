// Normalisation ops (PyTorch semantics): batch_norm, layer_norm, rms_norm.
//
// batch_norm runs on fused kernels (core/kernels/batch_norm.h: two passes over x forward, two backward, its
// backward written out, including the batch statistics' dependence on x in training mode); so does rms_norm on
// CPU devices (core/kernels/rms_norm.h: one pass each way, one rstd per row kept for the backward). layer_norm,
// and rms_norm on CUDA devices, are compositions of differentiable ops of core/ops.h (sum/mean, sub, mul,
// rsqrt) whose backward autograd derives. docs/LAYERS.md "Normalization, dropout, embedding" says why.
// Optional tensors (weight, bias, running stats) are passed as undefined Tensor() when absent.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace dpe {

// x: (N, C), (N, C, L) or (N, C, H, W) (any rank >= 2; channels at dim 1)
// running_mean, running_var, weight, bias: (C) or undefined.  ->  y: x's shape
//
// Batch statistics (training, or no running stats): per channel over N and the spatial dims;
//   y = (x - mean) / sqrt(var_biased + eps) * weight + bias.
// In training with running stats, they are updated in place, without autograd (NoGradGuard):
//   running_mean = (1 - momentum) * running_mean + momentum * mean
//   running_var  = (1 - momentum) * running_var  + momentum * var_unbiased     (like PyTorch)
// and training needs more than one value per channel (an error otherwise, as in PyTorch).
// Eval with running stats: y = (x - running_mean) / sqrt(running_var + eps) * weight + bias.
// num_batches_tracked (nn::BatchNorm's 0-dim int64 counter on x's device, or undefined): in training, += 1
// (in the statistics pass: no launches of its own on a GPU), after every check has passed.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps,
                  const Tensor& num_batches_tracked = Tensor());

// num_batches_tracked += 1 (a one-element int64 tensor), on its device without reading it back (no device sync);
// exact up to 2^53 batches. batch_norm's count where it has no statistics pass to count in, and SyncBatchNorm's.
void increment_batch_count(const Tensor& num_batches_tracked);

// x: (*, normalized_shape...)  weight, bias: normalized_shape or undefined  ->  y: x's shape
// Mean and biased variance over the trailing normalized_shape dims.
Tensor layer_norm(const Tensor& x, const std::vector<int64_t>& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps);

// x: (*, D)  weight: (D) or undefined  ->  y: x's shape
// y = x * rsqrt(mean(x^2 over the last dim) + eps) * weight  (Llama's RMSNorm, torch.nn.RMSNorm).
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps);

}  // namespace dpe
