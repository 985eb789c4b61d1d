// Pooling layers: PyTorch's nn.MaxPool2d, nn.AvgPool2d (count_include_pad=True) and nn.AdaptiveAvgPool2d,
// without parameters (core/ops/pool.h has the semantics).
#pragma once

#include <array>
#include <cstdint>

#include "layers/module.h"

namespace dpe::nn {

class MaxPool2d : public Cloneable<MaxPool2d> {
 public:
  // Square window; stride -1 means stride = kernel (PyTorch's stride=None).
  explicit MaxPool2d(int64_t kernel, int64_t stride = -1, int64_t padding = 0);
  MaxPool2d(std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride, std::array<int64_t, 2> padding = {0, 0});
  // x: (N, C, H, W) or (C, H, W)
  Tensor forward(const Tensor& x) override;

  std::array<int64_t, 2> kernel, stride, padding;
};

class AvgPool2d : public Cloneable<AvgPool2d> {
 public:
  explicit AvgPool2d(int64_t kernel, int64_t stride = -1, int64_t padding = 0);
  AvgPool2d(std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride, std::array<int64_t, 2> padding = {0, 0});
  Tensor forward(const Tensor& x) override;

  std::array<int64_t, 2> kernel, stride, padding;
};

class AdaptiveAvgPool2d : public Cloneable<AdaptiveAvgPool2d> {
 public:
  explicit AdaptiveAvgPool2d(std::array<int64_t, 2> output_size);
  Tensor forward(const Tensor& x) override;

  std::array<int64_t, 2> output_size;
};

}  // namespace dpe::nn
