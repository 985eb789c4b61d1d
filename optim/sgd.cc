#include "optim/sgd.h"

#include "core/autograd/grad_mode.h"
#include "core/error.h"
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
      Tensor d = p.grad();
      if (weight_decay != 0) d = add(d, mul(p, weight_decay));
      if (momentum != 0) {
        auto& state = tensor_state_[i];
        auto it = state.find("momentum_buffer");
        Tensor buf;
        if (it == state.end()) {
          buf = d.detach().clone();
          state["momentum_buffer"] = buf;
        } else {
          buf = it->second;
          buf.mul_(momentum).add_(d, 1.0 - dampening);
        }
        d = nesterov ? add(d, mul(buf, momentum)) : buf;
      }
      p.add_(d, -lr);
    }
  }
}

}  // namespace dpe::optim
