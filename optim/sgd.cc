#include "optim/sgd.h"

#include "core/autograd/grad_mode.h"
#include "core/dispatch.h"
#include "core/error.h"
#include "core/kernels/optimizer.h"
#include "core/ops.h"

namespace dpe::optim {
namespace {

void check_options(double lr, double momentum, double dampening, double weight_decay, bool nesterov) {
  DPE_CHECK(lr >= 0, "SGD: invalid learning rate ", lr);
  DPE_CHECK(momentum >= 0, "SGD: invalid momentum ", momentum);
  DPE_CHECK(weight_decay >= 0, "SGD: invalid weight_decay ", weight_decay);
  DPE_CHECK(!nesterov || (momentum > 0 && dampening == 0), "SGD: nesterov requires momentum > 0 and dampening 0 (got ",
            "momentum ", momentum, ", dampening ", dampening, ")");
}

// The fused kernel's layout: contiguous, float32/float64, on p's device with p's dtype and shape.
bool fusable_with(const Tensor& t, const Tensor& p) {
  return t.is_contiguous() && t.dtype() == p.dtype() && t.device() == p.device() && t.shape() == p.shape() &&
         (p.dtype() == DType::Float32 || p.dtype() == DType::Float64);
}

// buf: the momentum buffer (undefined without momentum); step.first_step: buf is new and written, not read.
void fused_sgd_step(const Tensor& p, const Tensor& buf, const kernels::SgdStep& step) {
  const Tensor& g = p.grad();
  void* buf_data = buf.defined() ? buf.data_ptr() : nullptr;
  dispatch(
      p.device(),
      [&] { kernels::sgd_step_cpu(p.dtype(), p.numel(), p.data_ptr(), g.data_ptr(), buf_data, step); },
      [&](auto stream) {
        kernels::sgd_step_cuda(stream, p.dtype(), p.numel(), p.data_ptr(), g.data_ptr(), buf_data, step);
      });
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

void SGD::step() {
  NoGradGuard no_grad;
  int64_t index = 0;
  for (ParamGroup& group : param_groups()) {
    const double lr = group.lr;
    const double momentum = group.options.at("momentum");
    const double dampening = group.options.at("dampening");
    const double weight_decay = group.options.at("weight_decay");
    const bool nesterov = group.options.at("nesterov") != 0.0;
    check_options(lr, momentum, dampening, weight_decay, nesterov);
    for (Tensor& p : group.params) {
      const int64_t i = index++;
      if (!p.grad().defined()) continue;
      kernels::SgdStep step{.lr = lr, .momentum = momentum, .dampening = dampening, .weight_decay = weight_decay,
                            .nesterov = nesterov};
      Tensor buf;  // the momentum buffer; undefined without momentum and before the first step
      if (momentum != 0) {
        auto& state = tensor_state_[i];
        auto it = state.find("momentum_buffer");
        step.first_step = it == state.end();
        if (!step.first_step) buf = it->second;
      }
      if (fusable_with(p, p) && fusable_with(p.grad(), p) && (!buf.defined() || fusable_with(buf, p))) {
        if (step.first_step) {
          buf = Tensor::empty(p.shape(), TensorOptions(p.dtype()).with_device(p.device()));
          tensor_state_[i]["momentum_buffer"] = buf;
        }
        fused_sgd_step(p, buf, step);
        continue;
      }
      // The same update as tensor ops, for any layout.
      Tensor d = p.grad();
      if (weight_decay != 0) d = add(d, mul(p, weight_decay));
      if (momentum != 0) {
        if (step.first_step) {
          buf = d.detach().clone();
          tensor_state_[i]["momentum_buffer"] = buf;
        } else {
          buf.mul_(momentum).add_(d, 1.0 - dampening);
        }
        d = nesterov ? add(d, mul(buf, momentum)) : buf;
      }
      p.add_(d, -lr);
    }
  }
}

}  // namespace dpe::optim
