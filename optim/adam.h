// Adam and AdamW: torch.optim.Adam / AdamW's exact single-tensor update (PyTorch 1.13, amsgrad=False):
//
//   t += 1
//   Adam:  g = grad + weight_decay * p               (L2 penalty through the gradient)
//   AdamW: p = p * (1 - lr * weight_decay); g = grad  (decoupled decay)
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g
//   denom = sqrt(v) / sqrt(1 - beta2^t) + eps        (eps outside the square root)
//   p -= (lr / (1 - beta1^t)) * m / denom
//
// State per parameter: tensors "exp_avg", "exp_avg_sq"; scalar "step".
// Contiguous parameters, gradients and moments of one float dtype on one device (the usual case) take one
// fused pass, with every parameter of the same step count (core/kernels/optimizer.h; on a GPU one launch for up
// to 48); anything else the same update as separate tensor ops.
#pragma once

#include <utility>
#include <vector>

#include "optim/optimizer.h"

namespace dpe::optim {

struct AdamOptions {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
};

struct AdamWOptions {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 1e-2;  // PyTorch's AdamW default
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options);
  void step() override;
  // lr, eps, weight_decay: finite and >= 0; beta1, beta2 in [0, 1); the "step" scalar a whole number >= 0
  // (Note [Hyper-parameter ranges], optim/optimizer.h).
  std::string hyper_parameter_violation(const std::string& name, double value) const override;
  std::string state_scalar_violation(const std::string& name, double value) const override;

 protected:
  // decoupled: AdamW's weight decay. type_name: "Adam" or "AdamW".
  Adam(std::vector<Tensor> params, const char* type_name, double lr, std::pair<double, double> betas, double eps,
       double weight_decay, bool decoupled);
  std::vector<std::string> state_tensor_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  std::vector<std::string> state_scalar_names() const override { return {"step"}; }

 private:
  bool decoupled_;
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options);
};

}  // namespace dpe::optim
