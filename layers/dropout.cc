#include "layers/dropout.h"

#include "core/error.h"
#include "core/ops/dropout.h"

namespace dpe::nn {

Dropout::Dropout(double p) : Cloneable("Dropout"), p_(p) {
  DPE_CHECK(p_ >= 0.0 && p_ <= 1.0, "Dropout: probability has to be between 0 and 1, but got ", p_);
}

// x: any shape  ->  x's shape
Tensor Dropout::forward(const Tensor& x) { return dropout(x, p_, is_training()); }

}  // namespace dpe::nn
