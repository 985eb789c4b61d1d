// 2-d convolution as a differentiable op (PyTorch's torch.nn.functional.conv2d).
#pragma once

#include <array>
#include <cstdint>

#include "core/tensor.h"

namespace dpe {

// x: (N, C_in, H, W) or unbatched (C_in, H, W)   weight: (C_out, C_in / groups, kH, kW)   bias: (C_out) or
// undefined.  Returns (N, C_out, H_out, W_out) (unbatched in, unbatched out) with
//   H_out = (H + 2 padding[0] - dilation[0] (kH - 1) - 1) / stride[0] + 1, likewise W_out.
// Cross-correlation, zero padding, groups split C_in and C_out into `groups` independent convolutions.
// x, weight and bias must share device and dtype (float32 or float64). Differentiable in all three.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, std::array<int64_t, 2> stride = {1, 1},
              std::array<int64_t, 2> padding = {0, 0}, std::array<int64_t, 2> dilation = {1, 1}, int64_t groups = 1);

// relu(max_pool2d(conv2d(x, weight, bias, stride, padding, dilation, groups), 2)): PyTorch's Conv2d -> ReLU ->
// MaxPool2d(2). In one pass each way where kernels::conv2d_relu_max_pool2d_applies (a CPU float32 first
// convolution, x not requiring grad, no autocast: Note [Convolution, ReLU and pool in one pass],
// core/kernels/conv_pool.h), whose sums run in their own order (the composition's values to rounding); the
// three ops otherwise. nn::Sequential runs its Conv2d -> ReLU -> MaxPool2d(2) triples so (layers/containers.cc).
Tensor conv2d_relu_max_pool2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {},
                              std::array<int64_t, 2> stride = {1, 1}, std::array<int64_t, 2> padding = {0, 0},
                              std::array<int64_t, 2> dilation = {1, 1}, int64_t groups = 1);

}  // namespace dpe
