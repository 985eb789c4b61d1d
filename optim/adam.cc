#include "optim/adam.h"

#include <cmath>

#include "core/allocator.h"
#include "core/autograd/grad_mode.h"
#include "core/dispatch.h"
#include "core/error.h"
#include "core/kernels/optimizer.h"
#include "core/ops.h"
#include "optim/fused_batches.h"

namespace dpe::optim {
namespace {

void check_options(const std::string& type, double lr, double beta1, double beta2, double eps, double weight_decay) {
  DPE_CHECK(lr >= 0, type, ": invalid learning rate ", lr);
  DPE_CHECK(eps >= 0, type, ": invalid eps ", eps);
  DPE_CHECK(beta1 >= 0 && beta1 < 1, type, ": invalid beta1 ", beta1, " (expected [0, 1))");
  DPE_CHECK(beta2 >= 0 && beta2 < 1, type, ": invalid beta2 ", beta2, " (expected [0, 1))");
  DPE_CHECK(weight_decay >= 0, type, ": invalid weight_decay ", weight_decay);
}

using detail::add_to_batch;
using detail::fusable_with;
// Key: the step count, which the bias corrections depend on (a parameter that missed a step has its own).
using AdamBatch = detail::FusedBatch<double, kernels::AdamTensor>;

}  // namespace

Adam::Adam(std::vector<Tensor> params, AdamOptions o)
    : Adam(std::move(params), "Adam", o.lr, o.betas, o.eps, o.weight_decay, false) {}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions o)
    : Adam(std::move(params), "AdamW", o.lr, o.betas, o.eps, o.weight_decay, true) {}

Adam::Adam(std::vector<Tensor> params, const char* type_name, double lr, std::pair<double, double> betas, double eps,
           double weight_decay, bool decoupled)
    : Optimizer(type_name,
                {{"beta1", betas.first}, {"beta2", betas.second}, {"eps", eps}, {"weight_decay", weight_decay}}, lr),
      decoupled_(decoupled) {
  check_options(type_name, lr, betas.first, betas.second, eps, weight_decay);
  add_param_group(ParamGroup{std::move(params), lr, {}});
}

std::string Adam::hyper_parameter_violation(const std::string& name, double value) const {
  if (name == "beta1" || name == "beta2") return value >= 0 && value < 1 ? "" : "expected a number in [0, 1)";
  if (name == "eps" || name == "weight_decay") {
    return std::isfinite(value) && value >= 0 ? "" : "expected a finite number >= 0";
  }
  return Optimizer::hyper_parameter_violation(name, value);  // lr
}

std::string Adam::state_scalar_violation(const std::string& name, double value) const {
  // 2^53: the largest count a double holds exactly.
  if (name == "step") {
    return std::isfinite(value) && value >= 0 && value <= 9007199254740992.0 && std::floor(value) == value
               ? ""
               : "expected a whole number in [0, 2^53]";
  }
  return Optimizer::state_scalar_violation(name, value);
}

void Adam::step() {
  MemoryKindGuard kind(MemoryKind::OptimizerState);  // its state, born here (core/allocator.h)
  NoGradGuard no_grad;
  int64_t index = 0;
  for (ParamGroup& group : param_groups()) {
    const double lr = group.lr;
    const double beta1 = group.options.at("beta1");
    const double beta2 = group.options.at("beta2");
    const double eps = group.options.at("eps");
    const double weight_decay = group.options.at("weight_decay");
    check_options(type_name(), lr, beta1, beta2, eps, weight_decay);
    std::vector<AdamBatch> batches;
    for (Tensor& p : group.params) {
      const int64_t i = index++;
      if (!p.grad().defined()) continue;
      auto& tensors = tensor_state_[i];
      if (!tensors.count("exp_avg")) {
        tensors["exp_avg"] = zeros_like(p);
        tensors["exp_avg_sq"] = zeros_like(p);
      }
      Tensor& exp_avg = tensors["exp_avg"];
      Tensor& exp_avg_sq = tensors["exp_avg_sq"];
      const double step = (scalar_state_[i]["step"] += 1.0);
      if (fusable_with(p, p) && fusable_with(p.grad(), p) && fusable_with(exp_avg, p) &&
          fusable_with(exp_avg_sq, p)) {
        add_to_batch(batches, p, step,
                     kernels::AdamTensor{.n = p.numel(), .param = p.data_ptr(), .grad = p.grad().data_ptr(),
                                         .exp_avg = exp_avg.data_ptr(), .exp_avg_sq = exp_avg_sq.data_ptr()});
        continue;
      }
      // The same update as tensor ops, for any layout.
      Tensor g = p.grad();
      if (weight_decay != 0) {
        if (decoupled_) {
          p.mul_(1.0 - lr * weight_decay);
        } else {
          g = add(g, mul(p, weight_decay));
        }
      }
      exp_avg.mul_(beta1).add_(g, 1.0 - beta1);
      exp_avg_sq.mul_(beta2).add_(mul(g, g), 1.0 - beta2);
      const double bias_correction1 = 1.0 - std::pow(beta1, step);
      const double bias_correction2 = 1.0 - std::pow(beta2, step);
      const double step_size = lr / bias_correction1;
      const TensorOptions options = TensorOptions(p.dtype()).with_device(p.device());
      Tensor denom = add(div(sqrt(exp_avg_sq), scalar_tensor(std::sqrt(bias_correction2), options)), eps);
      p.add_(div(exp_avg, denom), -step_size);
    }
    for (const AdamBatch& batch : batches) {
      const kernels::AdamStep step{.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps,
                                   .weight_decay = weight_decay, .decoupled = decoupled_, .step = batch.key};
      dispatch(
          batch.device, [&] { kernels::adam_step_cpu(batch.dtype, batch.items, step); },
          [&](auto stream) { kernels::adam_step_cuda(stream, batch.dtype, batch.items, step); });
    }
  }
}

}  // namespace dpe::optim
