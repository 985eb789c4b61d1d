// Activation checkpointing: torch.utils.checkpoint.checkpoint(fn, *inputs, use_reentrant=False).
//
//   h = nn::checkpoint(*block, [&](const std::vector<Tensor>& x) { return block->forward(x[0]); }, {h});
//
// The forward runs fn without recording a graph, so none of its intermediate activations stay alive; only the
// inputs and the state of the random generators of the devices its inputs, parameters and buffers are on are
// kept (no other device's: another thread may be drawing from it). The backward runs fn again from them with
// the same random numbers (dropout draws the same mask, bit for bit) and returns the gradients of the inputs and of `module`'s
// parameters through the checkpoint's own node, so each parameter's gradient is accumulated once, by the outer
// backward, with everything else it receives: its hooks (DDP's reducer) fire once per parameter, parameters
// used inside and outside the checkpoint are fine, and DDP's find_unused_parameters sees them reached (the
// crash PyTorch's reentrant checkpoint has with DDP cannot happen). The cost: fn's forward twice per step.
//
// Buffers: the recomputation would update them a second time (BatchNorm's running statistics, PyTorch's
// caveat); here `module`'s buffers are put back as the forward left them once it is done.
//
// Contract: fn is a pure function of its inputs and `module`'s parameters and buffers (a leaf that requires grad
// from elsewhere would receive its gradient during the recomputation, outside the outer pass's order); it
// returns one tensor; `module` outlives the backward. The recomputation runs under the autocast state of the
// forward. Without grad mode, or when nothing requires grad, it is fn(inputs).
#pragma once

#include <functional>
#include <vector>

#include "layers/module.h"

namespace dpe::nn {

using CheckpointFn = std::function<Tensor(const std::vector<Tensor>& inputs)>;
Tensor checkpoint(Module& module, const CheckpointFn& fn, const std::vector<Tensor>& inputs);
// The same over several modules' parameters and buffers (Sequential's segments).
Tensor checkpoint(const std::vector<Module*>& modules, const CheckpointFn& fn, const std::vector<Tensor>& inputs);

}  // namespace dpe::nn
