// Conv2d: PyTorch's nn.Conv2d (NCHW, zero padding, weight (C_out, C_in / groups, kH, kW), bias (C_out)).
#pragma once

#include <array>
#include <cstdint>

#include "layers/module.h"

namespace dpe::nn {

struct Conv2dOptions {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  std::array<int64_t, 2> kernel_size = {1, 1};
  std::array<int64_t, 2> stride = {1, 1};
  std::array<int64_t, 2> padding = {0, 0};
  std::array<int64_t, 2> dilation = {1, 1};
  int64_t groups = 1;
  bool bias = true;
  TensorOptions tensor_options = {};  // dtype and device of the parameters
};

class Conv2d : public Cloneable<Conv2d> {
 public:
  // Square kernel, stride and padding: Conv2d(3, 16, 3, 1, 1).
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride = 1, int64_t padding = 0);
  explicit Conv2d(Conv2dOptions options);

  // PyTorch's default init: weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
  // fan_in = in_channels / groups * kH * kW.
  void reset() override;
  // x: (N, C_in, H, W) or (C_in, H, W) -> (N, C_out, H_out, W_out) or (C_out, H_out, W_out)
  Tensor forward(const Tensor& x) override;
  // forward's check of x (rank and C_in), for callers that run the convolution themselves (nn::Sequential).
  void check_input(const Tensor& x) const;

  const Conv2dOptions& options() const { return options_; }
  Tensor weight;  // (out_channels, in_channels / groups, kH, kW)
  Tensor bias;    // (out_channels) or undefined

 private:
  Conv2dOptions options_;
};

}  // namespace dpe::nn
