#include "layers/normalization.h"

#include "core/error.h"
#include "core/ops.h"
#include "core/ops/norm.h"

namespace dpe::nn {

LayerNorm::LayerNorm(std::vector<int64_t> normalized_shape, double eps, bool elementwise_affine)
    : Cloneable("LayerNorm"),
      normalized_shape_(std::move(normalized_shape)),
      eps_(eps),
      elementwise_affine_(elementwise_affine) {
  DPE_CHECK(!normalized_shape_.empty(), "LayerNorm: normalized_shape must not be empty");
  for (int64_t d : normalized_shape_) {
    DPE_CHECK(d > 0, "LayerNorm: normalized_shape ", shape_str(normalized_shape_), " must have positive sizes");
  }
  DPE_CHECK(eps_ >= 0, "LayerNorm: eps ", eps_, " is negative");
  reset();
}

void LayerNorm::reset() {
  weight = bias = Tensor();
  if (elementwise_affine_) {
    weight = register_parameter("weight", ones(normalized_shape_));
    bias = register_parameter("bias", zeros(normalized_shape_));
  }
}

// x: (*, normalized_shape)  ->  x's shape
Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, normalized_shape_, weight, bias, eps_); }

RMSNorm::RMSNorm(int64_t dim, double eps) : Cloneable("RMSNorm"), dim_(dim), eps_(eps) {
  DPE_CHECK(dim_ > 0, "RMSNorm(", dim_, "): dim must be positive");
  DPE_CHECK(eps_ >= 0, "RMSNorm: eps ", eps_, " is negative");
  reset();
}

void RMSNorm::reset() { weight = register_parameter("weight", ones({dim_})); }

// x: (*, dim)  ->  x's shape
Tensor RMSNorm::forward(const Tensor& x) {
  DPE_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == dim_, "RMSNorm(", dim_, "): expected input (*, ", dim_,
            "), got ", x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  return rms_norm(x, weight, eps_);
}

}  // namespace dpe::nn
