#include "layers/module.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops.h"

namespace dpe::nn {

Tensor Module::forward(const Tensor&) {
  DPE_CHECK(false, type_name_, " does not implement forward(const Tensor&)");
}

std::vector<Tensor> Module::forward_args(const ModuleInput& input) {
  DPE_CHECK(input.args.size() == 1 && input.kwargs.empty(), type_name_, " takes one tensor; got ", input.args.size(),
            " positional and ", input.kwargs.size(), " named arguments (override forward_args for more)");
  return {forward(input.tensor(0))};
}

void Module::check_new_name(const std::string& name) const {
  DPE_CHECK(!name.empty() && name.find('.') == std::string::npos, type_name_, ": invalid name '", name,
            "' (names are non-empty and contain no '.')");
  auto taken = [&](const auto& entries) {
    return std::any_of(entries.begin(), entries.end(), [&](const auto& e) { return e.first == name; });
  };
  DPE_CHECK(!taken(parameters_) && !taken(buffers_) && !taken(children_), type_name_, ": name '", name,
            "' is already registered");
}

Tensor& Module::register_parameter(const std::string& name, Tensor value, bool requires_grad) {
  check_new_name(name);
  DPE_CHECK(value.defined(), type_name_, ": parameter '", name, "' is undefined");
  if (!value.is_leaf()) value = value.detach();
  if (requires_grad) value.set_requires_grad(true);
  parameters_.emplace_back(name, std::move(value));
  return parameters_.back().second;
}

Tensor& Module::register_buffer(const std::string& name, Tensor value) {
  check_new_name(name);
  DPE_CHECK(value.defined(), type_name_, ": buffer '", name, "' is undefined");
  buffers_.emplace_back(name, value.detach());
  return buffers_.back().second;
}

void Module::register_child(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name);
  DPE_CHECK(module != nullptr, type_name_, ": child module '", name, "' is null");
  children_.emplace_back(name, std::move(module));
}

void Module::replace_child(const std::string& name, std::shared_ptr<Module> module) {
  DPE_CHECK(module != nullptr, type_name_, ": replacement for child module '", name, "' is null");
  for (auto& [child_name, child] : children_) {
    if (child_name != name) continue;
    child = std::move(module);
    return;
  }
  std::string known;
  for (const auto& [child_name, child] : children_) known += (known.empty() ? "" : ", ") + child_name;
  DPE_CHECK(false, type_name_, ": no child module '", name, "' to replace (children: ", known.empty() ? "none" : known,
            ")");
}

void Module::clear_registrations() {
  parameters_.clear();
  buffers_.clear();
  children_.clear();
}

template <typename Visit>
void Module::visit_tensors(const std::string& prefix, bool recurse, bool params, bool bufs, Visit&& visit) const {
  if (params) {
    for (const auto& [name, t] : parameters_) visit(prefix + name, t);
  }
  if (bufs) {
    for (const auto& [name, t] : buffers_) visit(prefix + name, t);
  }
  if (!recurse) return;
  for (const auto& [name, child] : children_) child->visit_tensors(prefix + name + ".", true, params, bufs, visit);
}

StateDict Module::named_parameters(bool recurse) const {
  StateDict out;
  visit_tensors("", recurse, true, false, [&](const std::string& n, const Tensor& t) { out.emplace_back(n, t); });
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  visit_tensors("", recurse, true, false, [&](const std::string&, const Tensor& t) { out.push_back(t); });
  return out;
}

StateDict Module::named_buffers(bool recurse) const {
  StateDict out;
  visit_tensors("", recurse, false, true, [&](const std::string& n, const Tensor& t) { out.emplace_back(n, t); });
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  visit_tensors("", recurse, false, true, [&](const std::string&, const Tensor& t) { out.push_back(t); });
  return out;
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& [name, child] : children_) out.push_back(child);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const { return children_; }

std::vector<const Module*> Module::modules() const {
  std::vector<const Module*> out{this};
  for (const auto& [name, child] : children_) {
    auto below = child->modules();
    out.insert(out.end(), below.begin(), below.end());
  }
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::to(const Device& device) {
  check_device_exists(device);
  NoGradGuard no_grad;
  visit_tensors("", true, true, true, [&](const std::string&, const Tensor& t) {
    if (t.device() == device) return;
    t.set_data(t.detach().to(device));
    if (t.grad().defined()) t.set_grad(t.grad().to(device));
  });
}

void Module::to(DType dtype) {
  DPE_CHECK(is_floating_point(dtype), "Module::to(", dtype, "): expected a floating-point dtype");
  NoGradGuard no_grad;
  visit_tensors("", true, true, true, [&](const std::string&, const Tensor& t) {
    if (!is_floating_point(t.dtype()) || t.dtype() == dtype) return;
    t.set_data(t.detach().to(dtype));
    if (t.grad().defined()) t.set_grad(t.grad().to(dtype));
  });
}

Device Module::device() const {
  std::optional<Device> found;
  visit_tensors("", true, true, true, [&](const std::string& name, const Tensor& t) {
    if (!found) found = t.device();
    DPE_CHECK(*found == t.device(), type_name_, " has tensors on several devices (", *found, " and ", t.device(),
              " for '", name, "')");
  });
  return found.value_or(Device::cpu(0));
}

void Module::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (const Tensor& p : parameters()) {
    if (!p.grad().defined()) continue;
    if (set_to_none) {
      p.set_grad({});
    } else {
      p.grad().detach().zero_();
    }
  }
}

StateDict Module::state_dict() const {
  StateDict out;
  visit_tensors("", true, true, true, [&](const std::string& n, const Tensor& t) { out.emplace_back(n, t); });
  return out;
}

void Module::load_state_dict(const StateDict& state, bool strict) {
  StateDict own = state_dict();
  std::map<std::string, Tensor> incoming;
  for (const auto& [name, t] : state) incoming[name] = t;
  std::vector<std::string> missing, unexpected, mismatched;
  std::set<std::string> own_names;
  for (const auto& [name, t] : own) {
    own_names.insert(name);
    auto it = incoming.find(name);
    if (it == incoming.end()) {
      missing.push_back(name);
    } else if (it->second.shape() != t.shape()) {
      mismatched.push_back(name + " (checkpoint " + shape_str(it->second.shape()) + ", model " +
                           shape_str(t.shape()) + ")");
    }
  }
  for (const auto& [name, t] : state) {
    if (!own_names.count(name)) unexpected.push_back(name);
  }
  auto join = [](const std::vector<std::string>& names) {
    std::ostringstream os;
    for (size_t i = 0; i < names.size(); ++i) os << (i ? ", " : "") << names[i];
    return os.str();
  };
  bool fail = !mismatched.empty() || (strict && (!missing.empty() || !unexpected.empty()));
  DPE_CHECK(!fail, "load_state_dict into ", type_name_, " failed:",
            missing.empty() ? "" : " missing keys: " + join(missing) + ";",
            unexpected.empty() ? "" : " unexpected keys: " + join(unexpected) + ";",
            mismatched.empty() ? "" : " shape mismatch: " + join(mismatched) + ";",
            " nothing was loaded");
  NoGradGuard no_grad;
  for (const auto& [name, t] : own) {
    auto it = incoming.find(name);
    if (it != incoming.end()) t.detach().copy_(it->second);
  }
}

void Module::copy_state_from(const Module& other) {
  StateDict mine = state_dict(), theirs = other.state_dict();
  DPE_INTERNAL_ASSERT(mine.size() == theirs.size(), type_name_, ": clone has ", mine.size(), " tensors, source ",
                      theirs.size(), " (does reset() register everything the constructor does?)");
  NoGradGuard no_grad;
  for (size_t i = 0; i < mine.size(); ++i) {
    DPE_INTERNAL_ASSERT(mine[i].first == theirs[i].first, "clone structure differs at ", mine[i].first, " vs ",
                        theirs[i].first);
    Tensor& dst = mine[i].second;
    const Tensor& src = theirs[i].second;
    if (dst.shape() != src.shape() || dst.dtype() != src.dtype()) {
      dst.set_data(Tensor::empty(src.shape(), TensorOptions(src.dtype()).with_device(dst.device())));
    }
    dst.detach().copy_(src);
  }
  // A clone keeps each parameter's requires_grad (a frozen parameter stays frozen), like PyTorch's replicas.
  StateDict my_params = named_parameters(), their_params = other.named_parameters();
  DPE_INTERNAL_ASSERT(my_params.size() == their_params.size());
  for (size_t i = 0; i < my_params.size(); ++i) my_params[i].second.set_requires_grad(their_params[i].second.requires_grad());
}

PreserveRandomState::PreserveRandomState() {
  for (DeviceKind kind : {DeviceKind::CPU, DeviceKind::CUDA}) {
    for (const Device& d : all_devices(kind)) offsets_.emplace_back(d, default_generator(d).offset());
  }
}

PreserveRandomState::~PreserveRandomState() {
  for (const auto& [device, offset] : offsets_) default_generator(device).set_offset(offset);
}

}  // namespace dpe::nn
