#include "layers/checkpoint.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "core/amp/autocast.h"
#include "core/autograd/backward.h"
#include "core/autograd/function.h"
#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops.h"

namespace dpe::nn {

namespace {

// The default generators (seed, offset) of the devices the checkpointed tensors live on: what makes the
// recomputation draw the forward's numbers. Only those: other devices' generators belong to other threads
// (DataParallel's workers run their replicas' backward, and so this recomputation, at the same time).
struct RandomState {
  std::vector<std::pair<Device, std::pair<uint64_t, uint64_t>>> generators;

  static RandomState now(const std::vector<Device>& devices) {
    RandomState state;
    for (const Device& d : devices) {
      const Generator& g = default_generator(d);
      state.generators.emplace_back(d, std::pair{g.seed(), g.offset()});
    }
    return state;
  }
  void restore() const {
    for (const auto& [device, seed_offset] : generators) {
      Generator& g = default_generator(device);
      if (g.seed() != seed_offset.first) g.manual_seed(seed_offset.first);
      g.set_offset(seed_offset.second);
    }
  }
};

}  // namespace

Tensor checkpoint(Module& module, const CheckpointFn& fn, const std::vector<Tensor>& inputs) {
  return checkpoint(std::vector<Module*>{&module}, fn, inputs);
}

Tensor checkpoint(const std::vector<Module*>& modules, const CheckpointFn& fn, const std::vector<Tensor>& inputs) {
  DPE_CHECK(static_cast<bool>(fn), "checkpoint: no function");
  std::vector<Tensor> edges = inputs;  // the node's inputs: fn's inputs, then the parameters that require grad
  std::vector<Tensor> buffers;
  for (const Module* module : modules) {
    for (const Tensor& p : module->parameters()) {
      if (p.requires_grad()) edges.push_back(p);
    }
    for (const Tensor& b : module->buffers()) buffers.push_back(b);
  }
  if (!autograd::needs_grad(edges)) return fn(inputs);
  struct Saved {
    std::vector<Tensor> inputs;  // detached
    std::vector<bool> requires_grad;
    std::vector<Tensor> params, buffers;
    RandomState random;
    amp::AutocastState autocast;
    CheckpointFn fn;
  };
  auto saved = std::make_shared<Saved>();
  for (const Tensor& x : inputs) {
    saved->inputs.push_back(x.defined() ? x.detach() : x);
    saved->requires_grad.push_back(x.defined() && x.requires_grad());
  }
  saved->params.assign(edges.begin() + static_cast<std::ptrdiff_t>(inputs.size()), edges.end());
  saved->buffers = std::move(buffers);
  std::vector<Device> devices;
  for (const std::vector<Tensor>* list : {&edges, &saved->buffers}) {
    for (const Tensor& t : *list) {
      if (t.defined() && std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
        devices.push_back(t.device());
      }
    }
  }
  saved->random = RandomState::now(devices);
  saved->autocast = amp::autocast_state();
  saved->fn = fn;
  Tensor out;
  {
    NoGradGuard no_grad;
    out = fn(inputs);
  }
  DPE_CHECK(out.defined() && is_floating_point(out.dtype()), "checkpoint: fn returned ",
            out.defined() ? "a " + std::string(dtype_name(out.dtype())) + " tensor" : std::string("an undefined tensor"),
            "; expected a floating-point one");
  autograd::record(out, edges, "CheckpointBackward", [saved](const Tensor& grad) {
    // The forward again, recorded this time, on leaves standing for the inputs, with the forward's random
    // numbers and autocast; the generators then continue from where they are now.
    AutoGradMode grad_mode(true);
    std::vector<Tensor> xs, leaves;
    for (size_t i = 0; i < saved->inputs.size(); ++i) {
      Tensor x = saved->inputs[i].defined() ? saved->inputs[i].detach() : Tensor();
      if (saved->requires_grad[i]) {
        x.set_requires_grad(true);
        leaves.push_back(x);
      }
      xs.push_back(x);
    }
    Tensor y;
    {
      std::vector<Device> devices;
      for (const auto& [device, seed_offset] : saved->random.generators) devices.push_back(device);
      const RandomState after = RandomState::now(devices);
      const amp::AutocastState autocast = amp::autocast_state();
      std::vector<Tensor> buffers;  // as the forward left them
      for (const Tensor& b : saved->buffers) buffers.push_back(b.detach().clone());
      auto put_back = [&] {
        amp::set_autocast_state(autocast);
        after.restore();
        NoGradGuard no_grad;
        for (size_t i = 0; i < buffers.size(); ++i) saved->buffers[i].detach().copy_(buffers[i]);
      };
      saved->random.restore();
      amp::set_autocast_state(saved->autocast);
      try {
        y = saved->fn(xs);
      } catch (...) {
        put_back();
        throw;
      }
      put_back();
    }
    leaves.insert(leaves.end(), saved->params.begin(), saved->params.end());
    std::vector<Tensor> found = autograd::grad({y}, {grad}, leaves);
    // One gradient per edge of the node: fn's inputs (undefined where none is needed), then the parameters.
    std::vector<Tensor> grads;
    size_t next = 0;
    for (size_t i = 0; i < saved->inputs.size(); ++i) grads.push_back(saved->requires_grad[i] ? found[next++] : Tensor());
    for (size_t i = 0; i < saved->params.size(); ++i) grads.push_back(found[next++]);
    return grads;
  });
  return out;
}

}  // namespace dpe::nn
