// Optimizer: PyTorch's torch.optim.Optimizer for C++ (param groups, step, zero_grad, state_dict).
//
//   optim::SGD opt(model.parameters(), {.lr = 0.1, .momentum = 0.9});
//   opt.zero_grad(); loss.backward(); opt.step();
//
// Param groups: each group has its own parameters, lr and hyper-parameters (PyTorch's names: "momentum",
// "weight_decay", "beta1", ...); schedulers change group.lr. Per-parameter state (momentum buffers, Adam
// moments) is keyed by the parameter's index in the concatenation of all groups' parameters, as PyTorch's
// state_dict packs it.
//
// Steps run under NoGradGuard with in-place updates of the parameter tensors (handles held by modules stay
// valid); parameters whose grad is undefined are skipped, like PyTorch. State tensors live on their
// parameter's device.
// Thread-safety: one thread at a time per optimizer.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace dpe::optim {

struct ParamGroup {
  std::vector<Tensor> params;
  double lr = std::numeric_limits<double>::quiet_NaN();  // NaN: the optimizer's default lr
  std::map<std::string, double> options;  // every hyper-parameter but lr; booleans are 0/1; missing: default
};

// What state_dict() returns and load_state_dict() takes: PyTorch's {"state": ..., "param_groups": ...}
// with tensors and numbers, so checkpoints (io/checkpoint.h) can store it.
struct OptimizerStateDict {
  std::string type;  // "SGD", "Adam", "AdamW": loading into another type is an error
  struct Group {
    std::vector<int64_t> params;  // indices into the packed parameter list
    double lr = 0.0;
    std::map<std::string, double> options;
  };
  std::vector<Group> param_groups;
  // Per-parameter state, by packed index: tensors (e.g. "momentum_buffer", "exp_avg") and scalars ("step").
  std::map<int64_t, std::map<std::string, Tensor>> tensors;
  std::map<int64_t, std::map<std::string, double>> scalars;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Applies one update to every parameter that has a gradient.
  virtual void step() = 0;
  // set_to_none (default, like PyTorch 2): grads become undefined; otherwise zero-filled.
  void zero_grad(bool set_to_none = true);

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Adds a group; hyper-parameters it does not set take the optimizer's defaults (PyTorch's add_param_group).
  // A parameter may belong to one group only.
  void add_param_group(ParamGroup group);
  const std::string& type_name() const { return type_name_; }

  // Snapshot of the state: the state tensors are clones (later steps do not change a saved dict). Virtual, as
  // the two below, for a sharded optimizer (engine/zero_optimizer.h) that keeps its state in pieces and shows
  // the whole.
  virtual OptimizerStateDict state_dict() const;
  // Throws dpe::Error naming the problem when `state` does not fit this optimizer (type, number of groups,
  // parameters per group, state index out of range, state tensor shape differing from its parameter's,
  // unknown state names); nothing is modified then. On success, hyper-parameters and lr come from `state`
  // and state tensors are copied to each parameter's device and dtype.
  virtual void load_state_dict(const OptimizerStateDict& state);
  // The checks of load_state_dict alone (checkpoints validate everything before touching anything).
  virtual void check_state_dict(const OptimizerStateDict& state) const;

  // Note [Hyper-parameter ranges]: "" when `value` is valid for hyper-parameter `name` ("lr", or an option
  // such as "momentum", "beta1") of this optimizer, else what was expected ("expected a finite number >= 0");
  // "" for a name this optimizer does not have (check_state_dict reports those). The base allows a finite lr
  // >= 0 and any finite option; SGD and Adam narrow their own. check_state_dict (and so load_state_dict and
  // load_checkpoint) refuses values outside these ranges, so a NaN or negative value in a saved state fails
  // when it is loaded, naming the value, not at the first step.
  virtual std::string hyper_parameter_violation(const std::string& name, double value) const;
  // The same for a per-parameter state scalar (Adam's "step"); the base allows any finite value.
  virtual std::string state_scalar_violation(const std::string& name, double value) const;
  // The same for rules between the hyper-parameters of one group (SGD's nesterov needs momentum > 0 and
  // dampening 0); the base has none.
  virtual std::string param_group_violation(double lr, const std::map<std::string, double>& options) const;
  // Bytes of the per-parameter state tensors this optimizer holds now (the memory report's "optimizer state").
  virtual int64_t state_bytes() const;
  // Names of the per-parameter state tensors and scalars this optimizer keeps.
  virtual std::vector<std::string> state_tensor_names() const = 0;
  virtual std::vector<std::string> state_scalar_names() const = 0;

 protected:
  Optimizer(std::string type_name, std::map<std::string, double> defaults, double default_lr);

  // Per-parameter state by packed index (see the file comment).
  std::map<int64_t, std::map<std::string, Tensor>> tensor_state_;
  std::map<int64_t, std::map<std::string, double>> scalar_state_;

 private:
  std::string type_name_;
  std::map<std::string, double> defaults_;
  double default_lr_;
  std::vector<ParamGroup> groups_;
};

}  // namespace dpe::optim
