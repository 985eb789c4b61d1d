// Dropout: PyTorch's nn.Dropout (inverted dropout; identity in eval mode). Masks come from the default
// generator of the input's device, so each DP/DDP replica draws its own mask (core/ops/dropout.h).
#pragma once

#include "layers/module.h"

namespace dpe::nn {

class Dropout : public Cloneable<Dropout> {
 public:
  explicit Dropout(double p = 0.5);

  // x: any shape  ->  x's shape
  Tensor forward(const Tensor& x) override;

  double p() const { return p_; }

 private:
  double p_;
};

}  // namespace dpe::nn
