#include "layers/activation.h"

#include "core/error.h"
#include "core/ops.h"

namespace dpe::nn {

Tensor ReLU::forward(const Tensor& x) { return relu(x); }
Tensor GELU::forward(const Tensor& x) { return gelu(x); }
Tensor SiLU::forward(const Tensor& x) { return silu(x); }
Tensor Tanh::forward(const Tensor& x) { return tanh(x); }

Tensor Flatten::forward(const Tensor& x) {
  DPE_CHECK(x.defined(), "Flatten: undefined input");
  return x.flatten(start_dim_, end_dim_);
}

}  // namespace dpe::nn
