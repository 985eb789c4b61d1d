// Helpers for writing differentiable ops: a Node subclass built from a lambda, and the recording step.
//
//   Tensor out = ...compute...;
//   record(out, {a, b}, "MulBackward", [a, b](const Tensor& g) { return {mul(g, b), mul(g, a)}; });
//
// record() does nothing when grad mode is off or no input requires grad, so ops pay nothing in eval.
// The lambda captures what it needs (saved tensors); it runs with grad mode off.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/autograd/node.h"

namespace dpe::autograd {

using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;

class LambdaNode final : public Node {
 public:
  LambdaNode(std::string name, BackwardFn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override;
  std::string name() const override { return name_; }
  void release_saved() override { fn_ = nullptr; }

 private:
  std::string name_;
  BackwardFn fn_;
};

// True when an op on `inputs` must record a node.
bool needs_grad(std::initializer_list<const Tensor*> inputs);
bool needs_grad(const std::vector<Tensor>& inputs);

// Attaches a node computing the inputs' gradients from out's gradient. `fn` returns one gradient per input
// (undefined where an input needs none); shapes must match the inputs (checked).
void record(Tensor& out, const std::vector<Tensor>& inputs, std::string name, BackwardFn fn);

}  // namespace dpe::autograd
