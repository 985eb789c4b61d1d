#include "optim/sgd.h"

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

void check_options(double lr, double momentum, double dampening, double weight_decay, bool nesterov) {
  DPE_CHECK(lr >= 0, "SGD: invalid learning rate ", lr);
  DPE_CHECK(momentum >= 0, "SGD: invalid momentum ", momentum);
  DPE_CHECK(weight_decay >= 0, "SGD: invalid weight_decay ", weight_decay);
  DPE_CHECK(!nesterov || (momentum > 0 && dampening == 0), "SGD: nesterov requires momentum > 0 and dampening 0 (got ",
            "momentum ", momentum, ", dampening ", dampening, ")");
}

using detail::add_to_batch;
using detail::fusable_with;
// Key: the first step (the momentum buffer is new: written, not read).
using SgdBatch = detail::FusedBatch<bool, kernels::SgdTensor>;

void fused_sgd_step(const SgdBatch& batch, kernels::SgdStep step) {
  step.first_step = batch.key;
  dispatch(
      batch.device, [&] { kernels::sgd_step_cpu(batch.dtype, batch.items, step); },
      [&](auto stream) { kernels::sgd_step_cuda(stream, batch.dtype, batch.items, step); });
}

}  // namespace

SGD::SGD(std::vector<Tensor> params, SGDOptions o)
    : Optimizer("SGD",
                {{"momentum", o.momentum},
                 {"dampening", o.dampening},
                 {"weight_decay", o.weight_decay},
                 {"nesterov", o.nesterov ? 1.0 : 0.0}},
                o.lr) {
  check_options(o.lr, o.momentum, o.dampening, o.weight_decay, o.nesterov);
  add_param_group(ParamGroup{std::move(params), o.lr, {}});
}

std::string SGD::hyper_parameter_violation(const std::string& name, double value) const {
  if (name == "momentum" || name == "weight_decay") {
    return std::isfinite(value) && value >= 0 ? "" : "expected a finite number >= 0";
  }
  if (name == "nesterov") return value == 0 || value == 1 ? "" : "expected 0 or 1 (false or true)";
  return Optimizer::hyper_parameter_violation(name, value);  // lr, dampening
}

std::string SGD::param_group_violation(double, const std::map<std::string, double>& options) const {
  auto get = [&](const char* key) {
    auto it = options.find(key);
    return it == options.end() ? 0.0 : it->second;
  };
  if (get("nesterov") == 0 || (get("momentum") > 0 && get("dampening") == 0)) return "";
  return dpe::detail::str_cat("nesterov requires momentum > 0 and dampening 0, got momentum ", get("momentum"),
                         " and dampening ", get("dampening"));
}

void SGD::step() {
  MemoryKindGuard kind(MemoryKind::OptimizerState);  // its momentum buffers, born here (core/allocator.h)
  NoGradGuard no_grad;
  int64_t index = 0;
  for (ParamGroup& group : param_groups()) {
    const double lr = group.lr;
    const double momentum = group.options.at("momentum");
    const double dampening = group.options.at("dampening");
    const double weight_decay = group.options.at("weight_decay");
    const bool nesterov = group.options.at("nesterov") != 0.0;
    check_options(lr, momentum, dampening, weight_decay, nesterov);
    const kernels::SgdStep step{.lr = lr, .momentum = momentum, .dampening = dampening,
                                .weight_decay = weight_decay, .nesterov = nesterov};
    std::vector<SgdBatch> batches;
    for (Tensor& p : group.params) {
      const int64_t i = index++;
      if (!p.grad().defined()) continue;
      Tensor buf;  // the momentum buffer; undefined without momentum and before the first step
      bool first_step = false;
      if (momentum != 0) {
        auto& state = tensor_state_[i];
        auto it = state.find("momentum_buffer");
        first_step = it == state.end();
        if (!first_step) buf = it->second;
      }
      if (fusable_with(p, p) && fusable_with(p.grad(), p) && (!buf.defined() || fusable_with(buf, p))) {
        if (first_step) {
          buf = Tensor::empty(p.shape(), TensorOptions(p.dtype()).with_device(p.device()));
          tensor_state_[i]["momentum_buffer"] = buf;
        }
        add_to_batch(batches, p, first_step,
                     kernels::SgdTensor{.n = p.numel(), .param = p.data_ptr(), .grad = p.grad().data_ptr(),
                                        .momentum_buffer = buf.defined() ? buf.data_ptr() : nullptr});
        continue;
      }
      // The same update as tensor ops, for any layout.
      Tensor d = p.grad();
      if (weight_decay != 0) d = add(d, mul(p, weight_decay));
      if (momentum != 0) {
        if (first_step) {
          buf = d.detach().clone();
          tensor_state_[i]["momentum_buffer"] = buf;
        } else {
          buf.mul_(momentum).add_(d, 1.0 - dampening);
        }
        d = nesterov ? add(d, mul(buf, momentum)) : buf;
      }
      p.add_(d, -lr);
    }
    for (const SgdBatch& batch : batches) fused_sgd_step(batch, step);
  }
}

}  // namespace dpe::optim
