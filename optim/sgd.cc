#include "optim/sgd.h"

#include <algorithm>

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

// Parameters the fused kernel updates together: one device, one dtype, one first_step (a new momentum buffer is
// written, not read). On a GPU each batch is one launch, where a launch per parameter made a small model's
// optimizer step launch-bound (docs/BENCHMARKS.md, "the CNN's step is host-bound").
struct FusedBatch {
  Device device;
  DType dtype;
  bool first_step;
  std::vector<kernels::SgdTensor> tensors;
};

// p, buf: fusable_with p; buf undefined without momentum. They must outlive the batch's step.
void add_to_batch(std::vector<FusedBatch>& batches, const Tensor& p, const Tensor& buf, bool first_step) {
  auto it = std::find_if(batches.begin(), batches.end(), [&](const FusedBatch& b) {
    return b.device == p.device() && b.dtype == p.dtype() && b.first_step == first_step;
  });
  if (it == batches.end()) it = batches.insert(batches.end(), FusedBatch{p.device(), p.dtype(), first_step, {}});
  it->tensors.push_back({.n = p.numel(), .param = p.data_ptr(), .grad = p.grad().data_ptr(),
                         .momentum_buffer = buf.defined() ? buf.data_ptr() : nullptr});
}

void fused_sgd_step(const FusedBatch& batch, kernels::SgdStep step) {
  step.first_step = batch.first_step;
  dispatch(
      batch.device, [&] { kernels::sgd_step_cpu(batch.dtype, batch.tensors, step); },
      [&](auto stream) { kernels::sgd_step_cuda(stream, batch.dtype, batch.tensors, step); });
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
    const kernels::SgdStep step{.lr = lr, .momentum = momentum, .dampening = dampening,
                                .weight_decay = weight_decay, .nesterov = nesterov};
    std::vector<FusedBatch> batches;
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
        add_to_batch(batches, p, buf, first_step);
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
    for (const FusedBatch& batch : batches) fused_sgd_step(batch, step);
  }
}

}  // namespace dpe::optim
