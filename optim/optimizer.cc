#include "optim/optimizer.h"

#include <cmath>
#include <set>

#include "core/allocator.h"
#include "core/autograd/grad_mode.h"
#include "core/error.h"

namespace dpe::optim {

Optimizer::Optimizer(std::string type_name, std::map<std::string, double> defaults, double default_lr)
    : type_name_(std::move(type_name)), defaults_(std::move(defaults)), default_lr_(default_lr) {}

void Optimizer::add_param_group(ParamGroup group) {
  for (const auto& [key, value] : group.options) {
    DPE_CHECK(defaults_.count(key), type_name_, ": unknown hyper-parameter '", key, "' in a param group");
  }
  for (const auto& [key, value] : defaults_) group.options.emplace(key, value);
  if (std::isnan(group.lr)) group.lr = default_lr_;
  DPE_CHECK(group.lr >= 0, type_name_, ": invalid learning rate ", group.lr);
  std::set<const TensorImpl*> seen;
  for (const ParamGroup& g : groups_) {
    for (const Tensor& p : g.params) seen.insert(p.impl());
  }
  for (size_t i = 0; i < group.params.size(); ++i) {
    const Tensor& p = group.params[i];
    DPE_CHECK(p.defined(), type_name_, ": parameter ", i, " of a param group is undefined");
    DPE_CHECK(is_compute_type(p.dtype()), type_name_, ": parameter ", i, " has dtype ", p.dtype(),
              "; optimizers update float32 or float64 parameters");
    DPE_CHECK(p.is_leaf(), type_name_, ": parameter ", i, " ", shape_str(p.shape()),
              " is not a leaf tensor (optimizers update leaves)");
    DPE_CHECK(seen.insert(p.impl()).second, type_name_, ": parameter ", i, " ", shape_str(p.shape()),
              " appears in more than one param group (or twice in one)");
  }
  groups_.push_back(std::move(group));
}

void Optimizer::zero_grad(bool set_to_none) {
  for (ParamGroup& g : groups_) {
    for (Tensor& p : g.params) {
      if (!p.grad().defined()) continue;
      if (set_to_none) {
        p.set_grad(Tensor());
      } else {
        NoGradGuard no_grad;
        Tensor grad = p.grad();
        grad.zero_();
      }
    }
  }
}

int64_t Optimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& [i, named] : tensor_state_) {
    for (const auto& [name, t] : named) bytes += static_cast<int64_t>(t.nbytes());
  }
  return bytes;
}

OptimizerStateDict Optimizer::state_dict() const {
  OptimizerStateDict out;
  out.type = type_name_;
  int64_t index = 0;
  for (const ParamGroup& g : groups_) {
    OptimizerStateDict::Group group;
    group.lr = g.lr;
    group.options = g.options;
    for (size_t i = 0; i < g.params.size(); ++i) group.params.push_back(index++);
    out.param_groups.push_back(std::move(group));
  }
  for (const auto& [i, named] : tensor_state_) {
    for (const auto& [name, t] : named) out.tensors[i][name] = t.detach().clone();
  }
  out.scalars = scalar_state_;
  return out;
}

void Optimizer::check_state_dict(const OptimizerStateDict& state) const {
  const std::string& T = type_name_;
  DPE_CHECK(state.type == T, T, ".load_state_dict: the state belongs to a ", state.type, " optimizer, not ", T);
  DPE_CHECK(state.param_groups.size() == groups_.size(), T, ".load_state_dict: the state has ",
            state.param_groups.size(), " param groups, the optimizer ", groups_.size());
  std::vector<const Tensor*> packed;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const auto& saved = state.param_groups[gi];
    DPE_CHECK(saved.params.size() == groups_[gi].params.size(), T, ".load_state_dict: param group ", gi,
              " has ", saved.params.size(), " parameters in the state, ", groups_[gi].params.size(),
              " in the optimizer");
    for (const auto& [key, value] : saved.options) {
      DPE_CHECK(defaults_.count(key), T, ".load_state_dict: param group ", gi, " has unknown hyper-parameter '", key,
                "'");
    }
    for (const auto& [key, value] : defaults_) {
      DPE_CHECK(saved.options.count(key), T, ".load_state_dict: param group ", gi, " lacks hyper-parameter '", key,
                "'");
    }
    // Values (Note [Hyper-parameter ranges]): a NaN or negative learning rate once loaded silently and failed
    // at the first step.
    std::string expected = hyper_parameter_violation("lr", saved.lr);
    DPE_CHECK(expected.empty(), T, ".load_state_dict: param group ", gi, " has lr ", saved.lr, "; ", expected);
    for (const auto& [key, value] : saved.options) {
      expected = hyper_parameter_violation(key, value);
      DPE_CHECK(expected.empty(), T, ".load_state_dict: param group ", gi, " has ", key, " ", value, "; ", expected);
    }
    expected = param_group_violation(saved.lr, saved.options);
    DPE_CHECK(expected.empty(), T, ".load_state_dict: param group ", gi, ": ", expected);
    for (size_t i = 0; i < saved.params.size(); ++i) {
      DPE_CHECK(saved.params[i] == static_cast<int64_t>(packed.size()), T, ".load_state_dict: param group ", gi,
                " parameter ", i, " has index ", saved.params[i], ", expected ", packed.size());
      packed.push_back(&groups_[gi].params[i]);
    }
  }
  const std::vector<std::string> tensor_names = state_tensor_names();
  const std::vector<std::string> scalar_names = state_scalar_names();
  auto known = [](const std::vector<std::string>& names, const std::string& n) {
    for (const std::string& k : names) {
      if (k == n) return true;
    }
    return false;
  };
  for (const auto& [i, named] : state.tensors) {
    DPE_CHECK(i >= 0 && i < static_cast<int64_t>(packed.size()), T, ".load_state_dict: state for parameter ", i,
              " but the optimizer has ", packed.size(), " parameters");
    for (const auto& [name, t] : named) {
      DPE_CHECK(known(tensor_names, name), T, ".load_state_dict: unknown state tensor '", name, "' for parameter ",
                i);
      DPE_CHECK(t.defined(), T, ".load_state_dict: state tensor '", name, "' of parameter ", i, " is undefined");
      DPE_CHECK(t.shape() == packed[i]->shape(), T, ".load_state_dict: state tensor '", name, "' of parameter ", i,
                " has shape ", shape_str(t.shape()), " but the parameter has shape ", shape_str(packed[i]->shape()));
      DPE_CHECK(is_compute_type(t.dtype()) || t.dtype() == DType::Float16 || t.dtype() == DType::BFloat16, T,
                ".load_state_dict: state tensor '", name, "' of parameter ", i, " has non-floating dtype ", t.dtype());
    }
  }
  for (const auto& [i, named] : state.scalars) {
    DPE_CHECK(i >= 0 && i < static_cast<int64_t>(packed.size()), T, ".load_state_dict: state for parameter ", i,
              " but the optimizer has ", packed.size(), " parameters");
    for (const auto& [name, v] : named) {
      DPE_CHECK(known(scalar_names, name), T, ".load_state_dict: unknown state scalar '", name, "' for parameter ",
                i);
      const std::string expected = state_scalar_violation(name, v);
      DPE_CHECK(expected.empty(), T, ".load_state_dict: state scalar '", name, "' of parameter ", i, " is ", v, "; ",
                expected);
    }
  }
  // A parameter's state is all or nothing: a step must never find half of it.
  std::set<int64_t> with_state;
  for (const auto& [i, named] : state.tensors) with_state.insert(i);
  for (const auto& [i, named] : state.scalars) with_state.insert(i);
  for (int64_t i : with_state) {
    for (const std::string& name : tensor_names) {
      DPE_CHECK(state.tensors.count(i) && state.tensors.at(i).count(name), T, ".load_state_dict: parameter ", i,
                " has state but lacks state tensor '", name, "'");
    }
    for (const std::string& name : scalar_names) {
      DPE_CHECK(state.scalars.count(i) && state.scalars.at(i).count(name), T, ".load_state_dict: parameter ", i,
                " has state but lacks state scalar '", name, "'");
    }
  }
}

std::string Optimizer::hyper_parameter_violation(const std::string& name, double value) const {
  if (name == "lr") return std::isfinite(value) && value >= 0 ? "" : "expected a finite number >= 0";
  return std::isfinite(value) ? "" : "expected a finite number";
}

std::string Optimizer::state_scalar_violation(const std::string&, double value) const {
  return std::isfinite(value) ? "" : "expected a finite number";
}

std::string Optimizer::param_group_violation(double, const std::map<std::string, double>&) const { return ""; }

void Optimizer::load_state_dict(const OptimizerStateDict& state) {
  check_state_dict(state);
  MemoryKindGuard kind(MemoryKind::OptimizerState);
  std::vector<const Tensor*> packed;
  for (const ParamGroup& g : groups_) {
    for (const Tensor& p : g.params) packed.push_back(&p);
  }
  // Build the new state first: allocation or copy failures leave the optimizer as it was.
  std::map<int64_t, std::map<std::string, Tensor>> tensors;
  for (const auto& [i, named] : state.tensors) {
    for (const auto& [name, t] : named) {
      Tensor copy = Tensor::empty(packed[i]->shape(), TensorOptions(packed[i]->dtype()).with_device(packed[i]->device()));
      NoGradGuard no_grad;
      copy.copy_(t.detach());
      tensors[i][name] = copy;
    }
  }
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    groups_[gi].lr = state.param_groups[gi].lr;
    groups_[gi].options = state.param_groups[gi].options;
  }
  tensor_state_ = std::move(tensors);
  scalar_state_ = state.scalars;
}

}  // namespace dpe::optim
