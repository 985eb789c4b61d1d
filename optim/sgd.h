// SGD with momentum, dampening, Nesterov and weight decay: torch.optim.SGD's exact update (PyTorch 1.13):
//
//   d = grad + weight_decay * p                      (if weight_decay != 0)
//   if momentum != 0:
//     buf = d                                        (first step: a copy of d, no dampening)
//     buf = momentum * buf + (1 - dampening) * d     (later steps)
//     d = nesterov ? d + momentum * buf : buf
//   p -= lr * d
//
// State per parameter: "momentum_buffer" (only when momentum != 0).
// Contiguous parameters, gradients and buffers of one float dtype on one device (the usual case) take one
// fused pass (core/kernels/optimizer.h; on a GPU one launch for up to 48); anything else the same update as
// separate tensor ops.
#pragma once

#include <vector>

#include "optim/optimizer.h"

namespace dpe::optim {

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;  // requires momentum > 0 and dampening == 0 (checked)
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);
  void step() override;
  // lr, momentum, weight_decay: finite and >= 0; dampening: finite; nesterov: 0 or 1, and then momentum > 0
  // and dampening 0 (Note [Hyper-parameter ranges], optim/optimizer.h).
  std::string hyper_parameter_violation(const std::string& name, double value) const override;
  std::string param_group_violation(double lr, const std::map<std::string, double>& options) const override;

 protected:
  std::vector<std::string> state_tensor_names() const override { return {"momentum_buffer"}; }
  std::vector<std::string> state_scalar_names() const override { return {}; }
};

}  // namespace dpe::optim
