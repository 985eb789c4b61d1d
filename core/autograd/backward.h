// Reverse-mode execution of the recorded graph.
//
// backward() runs on the calling thread and touches only the graph reachable from `roots`; several threads
// may run backward at once on disjoint graphs (DP replicas), sharing nothing but leaves' locked .grad.
// Nodes run as soon as all their gradient contributions have arrived, newest first (by sequence number).
// Saved tensors are released afterwards; a second backward through the same graph is an error.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace dpe::autograd {

// gradients[i] is the gradient of roots[i] (same shape); an undefined entry means ones (one-element roots only).
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& gradients);

// torch.autograd.grad(roots, inputs, gradients, allow_unused=True) for leaf inputs: the gradients reaching
// each input (undefined where none does), returned instead of accumulated into its .grad (its hooks do not
// run); other leaves the graph reaches accumulate as in backward(). inputs: leaves that require grad.
std::vector<Tensor> grad(const std::vector<Tensor>& roots, const std::vector<Tensor>& gradients,
                         const std::vector<Tensor>& inputs);

}  // namespace dpe::autograd
