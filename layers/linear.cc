#include "layers/linear.h"

#include "core/error.h"
#include "core/ops.h"
#include "layers/init.h"

namespace dpe::nn {

Linear::Linear(int64_t in_features, int64_t out_features, bool bias)
    : Linear(LinearOptions{in_features, out_features, bias}) {}

Linear::Linear(LinearOptions options) : Cloneable("Linear"), options_(options) {
  DPE_CHECK(options_.in_features > 0 && options_.out_features > 0, "Linear(", options_.in_features, ", ",
            options_.out_features, "): feature counts must be positive");
  reset();
}

void Linear::reset() {
  TensorOptions opts = options_.tensor_options.with_requires_grad(false);
  weight = register_parameter("weight", Tensor::empty({options_.out_features, options_.in_features}, opts));
  init::uniform_fan_in_(weight, options_.in_features);
  bias = Tensor();
  if (options_.bias) {
    bias = register_parameter("bias", Tensor::empty({options_.out_features}, opts));
    init::uniform_fan_in_(bias, options_.in_features);
  }
}

Tensor Linear::forward(const Tensor& x) {
  DPE_CHECK(x.dim() >= 1 && x.size(-1) == options_.in_features, "Linear(", options_.in_features, ", ",
            options_.out_features, "): expected input (..., ", options_.in_features, "), got ", shape_str(x.shape()));
  return linear(x, weight, bias);
}

}  // namespace dpe::nn
