#include "core/autograd/function.h"

#include "core/autograd/grad_mode.h"
#include "core/error.h"

namespace dpe::autograd {

std::vector<Tensor> LambdaNode::apply(std::vector<Tensor>&& grad_outputs) {
  DPE_CHECK(fn_ != nullptr, "backward through ", name_,
            " a second time: its saved tensors were freed after the first backward");
  DPE_INTERNAL_ASSERT(grad_outputs.size() == 1);
  return fn_(grad_outputs[0]);
}

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor* t : inputs) {
    if (t->defined() && t->requires_grad()) return true;
  }
  return false;
}

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

namespace {

// Checks and wraps a user backward so that every gradient has its input's shape, dtype and device.
BackwardFn checked_backward(std::string name, std::vector<Shape> shapes, std::vector<Device> devices, BackwardFn fn) {
  return [name = std::move(name), shapes = std::move(shapes), devices = std::move(devices),
          fn = std::move(fn)](const Tensor& grad_output) {
    std::vector<Tensor> grads = fn(grad_output);
    DPE_INTERNAL_ASSERT(grads.size() == shapes.size(), name, " returned ", grads.size(), " gradients for ",
                        shapes.size(), " inputs");
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) continue;
      DPE_INTERNAL_ASSERT(grads[i].shape() == shapes[i] && grads[i].device() == devices[i], name, " input ", i,
                          ": gradient ", shape_str(grads[i].shape()), " on ", grads[i].device(), " for input ",
                          shape_str(shapes[i]), " on ", devices[i]);
    }
    return grads;
  };
}

}  // namespace

void record(Tensor& out, const std::vector<Tensor>& inputs, std::string name, BackwardFn fn) {
  if (!needs_grad(inputs)) return;
  std::vector<Shape> shapes;
  std::vector<Device> devices;
  for (const Tensor& t : inputs) {
    shapes.push_back(t.defined() ? t.shape() : Shape{});
    devices.push_back(t.defined() ? t.device() : Device{});
  }
  auto node = std::make_shared<LambdaNode>(name, checked_backward(name, std::move(shapes), std::move(devices),
                                                                   std::move(fn)));
  for (const Tensor& t : inputs) node->next_edges.push_back(gradient_edge(t));
  auto& meta = meta_of(out);
  meta.grad_fn = std::move(node);
  meta.output_nr = 0;
}

}  // namespace dpe::autograd
