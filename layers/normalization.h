// LayerNorm and RMSNorm: PyTorch's nn.LayerNorm and nn.RMSNorm (Llama's RMSNorm) over core/ops/norm.h.
#pragma once

#include <vector>

#include "layers/module.h"

namespace dpe::nn {

// Normalises over the trailing normalized_shape dims; weight = 1, bias = 0 (when elementwise_affine).
class LayerNorm : public Cloneable<LayerNorm> {
 public:
  explicit LayerNorm(std::vector<int64_t> normalized_shape, double eps = 1e-5, bool elementwise_affine = true);

  void reset() override;
  // x: (*, normalized_shape...)  ->  x's shape
  Tensor forward(const Tensor& x) override;

  const std::vector<int64_t>& normalized_shape() const { return normalized_shape_; }
  double eps() const { return eps_; }
  Tensor weight;  // normalized_shape, or undefined
  Tensor bias;    // normalized_shape, or undefined

 private:
  std::vector<int64_t> normalized_shape_;
  double eps_;
  bool elementwise_affine_;
};

// y = x * rsqrt(mean(x^2 over the last dim) + eps) * weight; weight (dim) = 1.
class RMSNorm : public Cloneable<RMSNorm> {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6);

  void reset() override;
  // x: (*, dim)  ->  x's shape
  Tensor forward(const Tensor& x) override;

  int64_t dim() const { return dim_; }
  double eps() const { return eps_; }
  Tensor weight;  // (dim)

 private:
  int64_t dim_;
  double eps_;
};

}  // namespace dpe::nn
