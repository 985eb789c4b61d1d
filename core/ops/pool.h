// 2-d pooling as differentiable ops (PyTorch's max_pool2d, avg_pool2d, adaptive_avg_pool2d), with
// ceil_mode = False, dilation 1 and, for avg_pool2d, count_include_pad = True (PyTorch's defaults).
//
// x: (N, C, H, W) or unbatched (C, H, W), float32 or float64; the result has the same rank.
// Window pools: H_out = (H + 2 padding[0] - kernel[0]) / stride[0] + 1, likewise W_out; padding must be at
// most half the kernel (PyTorch's rule). stride defaults to the kernel size.
#pragma once

#include <array>
#include <cstdint>

#include "core/ops.h"
#include "core/tensor.h"

namespace dpe {

// Max over each window; padding counts as -inf. The gradient goes to the first maximum of each window
// (row-major order), so tests use inputs without ties.
Tensor max_pool2d(const Tensor& x, std::array<int64_t, 2> kernel);
Tensor max_pool2d(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                  std::array<int64_t, 2> padding = {0, 0});
// The same, with the int64 indices (flat offset i * W + j of each maximum in its (H, W) plane), like
// PyTorch's return_indices=True. Only `values` is differentiable.
ValuesIndices max_pool2d_with_indices(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                                      std::array<int64_t, 2> padding = {0, 0});

// relu(max_pool2d(x, ...)), values and gradient bit for bit, in one pass where the 2x2 window-code kernels take
// it (CPU, float32, kernel 2, stride 2, no padding: Note [Window codes]) and on CUDA devices (any window); the
// two ops otherwise. nn::Sequential
// runs a ReLU -> MaxPool2d pair so (Note [ReLU before MaxPool2d], layers/containers.cc).
Tensor max_pool2d_relu(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                       std::array<int64_t, 2> padding = {0, 0});

// Mean over each window; zero padding is counted in the divisor (count_include_pad = True).
Tensor avg_pool2d(const Tensor& x, std::array<int64_t, 2> kernel);
Tensor avg_pool2d(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                  std::array<int64_t, 2> padding = {0, 0});

// Output (H_out, W_out) = output_size; cell (i, j) averages rows [floor(i H / H_out), ceil((i + 1) H / H_out))
// and likewise columns (windows may overlap when the sizes do not divide).
Tensor adaptive_avg_pool2d(const Tensor& x, std::array<int64_t, 2> output_size);

}  // namespace dpe
