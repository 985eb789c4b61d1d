// Linear: y = x W^T + b, PyTorch's nn.Linear (weight (out, in), bias (out), default init).
#pragma once

#include "layers/module.h"

namespace dpe::nn {

struct LinearOptions {
  int64_t in_features = 0;
  int64_t out_features = 0;
  bool bias = true;
  TensorOptions tensor_options = {};  // dtype and device of the parameters
};

class Linear : public Cloneable<Linear> {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  explicit Linear(LinearOptions options);

  void reset() override;
  // x: (..., in_features) -> (..., out_features)
  Tensor forward(const Tensor& x) override;

  const LinearOptions& options() const { return options_; }
  Tensor weight;  // (out_features, in_features)
  Tensor bias;    // (out_features) or undefined

 private:
  LinearOptions options_;
};

}  // namespace dpe::nn
