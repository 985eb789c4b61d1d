// Module: PyTorch's nn.Module for C++ (the libtorch conventions users know).
//
//   class Mlp : public dpe::nn::Cloneable<Mlp> {
//    public:
//     Mlp() : Cloneable("Mlp") { reset(); }
//     void reset() override {            // (re)creates every parameter, buffer and child
//       fc1 = register_module("fc1", std::make_shared<Linear>(784, 512));
//       fc2 = register_module("fc2", std::make_shared<Linear>(512, 10));
//     }
//     Tensor forward(const Tensor& x) override { return fc2->forward(relu(fc1->forward(x))); }
//     std::shared_ptr<Linear> fc1, fc2;
//   };
//
// Names: parameters, buffers and children share one namespace per module; named_parameters() joins them
// with dots ("fc1.weight"). Order is PyTorch's, everywhere (state_dict, parameters(), DDP buckets): a
// module's own parameters, then its own buffers (state_dict), then each child's, in registration order.
//
// Replicas: clone(device) is a deep copy on `device`: every parameter and buffer is a new tensor with the
// same values (requires_grad kept), children are cloned recursively, nothing is shared with the original.
// Cloneable<Derived> implements it by copy-constructing Derived, calling reset() on the copy (which rebuilds
// its members) and copying the values in; containers clone their children one by one.
//
// Thread-safety: a module may be used by one thread at a time (each DP replica has its own worker).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "layers/module_io.h"

namespace dpe::nn {

// Ordered name -> tensor map of parameters and buffers, with dotted names.
using StateDict = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  explicit Module(std::string type_name) : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = default;  // shallow: Cloneable's clone() re-creates members with reset()
  Module& operator=(const Module&) = delete;

  const std::string& type_name() const { return type_name_; }

  // The single-tensor forward used by Sequential and the engine. Modules with other signatures may
  // leave it; calling it then is an error naming the module type.
  virtual Tensor forward(const Tensor& input);
  // The structured forward used by DataParallel: any positional/named arguments in, a list of tensors out.
  // Default: exactly one positional tensor and no named argument, passed to forward(const Tensor&).
  virtual std::vector<Tensor> forward_args(const ModuleInput& input);

  // Re-creates the module's parameters, buffers and children (freshly initialised). Called by constructors
  // and by Cloneable::clone.
  virtual void reset() {}

  // Deep copy on `device` (see the file comment).
  virtual std::shared_ptr<Module> clone(const Device& device) const = 0;

  // ---- registration; each returns the stored handle. Names must be non-empty, without '.', and unique
  //      among this module's parameters, buffers and children. ----
  Tensor& register_parameter(const std::string& name, Tensor value, bool requires_grad = true);
  Tensor& register_buffer(const std::string& name, Tensor value);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    register_child(name, module);
    return module;
  }
  // Replaces the child registered as `name` by `module` at the same position (names and state_dict order
  // are kept) and returns it; throws if there is no child `name`. Like libtorch's replace_module, only the
  // registry changes: a typed member the parent keeps (`std::shared_ptr<BatchNorm2d> bn`) still points at
  // the old child (assign it too: `bn = replace_module("bn", other_bn)`), and a Cloneable parent's clone()
  // rebuilds its children with reset(), i.e. with the old type. Containers (Sequential, ModuleList,
  // ModuleDict) reach their children only through the registry and clone child by child: for them the
  // replacement is complete.
  template <typename M>
  std::shared_ptr<M> replace_module(const std::string& name, std::shared_ptr<M> module) {
    replace_child(name, module);
    return module;
  }

  // ---- traversal ----
  std::vector<Tensor> parameters(bool recurse = true) const;
  StateDict named_parameters(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  StateDict named_buffers(bool recurse = true) const;
  std::vector<std::shared_ptr<Module>> children() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  // This module and every descendant, depth-first, parents first (non-owning; valid while this lives).
  std::vector<const Module*> modules() const;

  // ---- mode, placement, gradients ----
  void train(bool on = true);  // recursive
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Moves every parameter, buffer and gradient to `device` in place: handles held elsewhere (optimizers)
  // stay valid.
  void to(const Device& device);
  void to(DType dtype);  // floating-point parameters and buffers only
  // The device of the first parameter or buffer (cpu:0 for a module without tensors); throws if the
  // module's tensors are on several devices.
  Device device() const;
  // set_to_none (default, like PyTorch 2): grads become undefined; otherwise zero-filled.
  void zero_grad(bool set_to_none = true);

  // ---- state ----
  StateDict state_dict() const;  // parameters and buffers, dotted names, registration order
  // Copies values in (converting dtype/device to the module's). strict: every key of the module must be
  // present, no extra key allowed; either way a shape mismatch is an error. The error lists missing,
  // unexpected and mis-shaped keys, and nothing is modified when it throws.
  void load_state_dict(const StateDict& state, bool strict = true);

  // Copies parameter and buffer values from `other` (same structure) into this module's tensors.
  void copy_state_from(const Module& other);

 protected:
  void register_child(const std::string& name, std::shared_ptr<Module> module);
  void replace_child(const std::string& name, std::shared_ptr<Module> module);
  // Forgets every registration (Cloneable::clone calls it before reset()).
  void clear_registrations();

 private:
  void check_new_name(const std::string& name) const;
  template <typename Visit>
  void visit_tensors(const std::string& prefix, bool recurse, bool params, bool bufs, Visit&& visit) const;

  std::string type_name_;
  bool training_ = true;
  std::vector<std::pair<std::string, Tensor>> parameters_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

// Saves the offsets of every default generator and restores them on destruction, so that the throwaway
// initialisation inside clone() does not shift the random stream the user's program sees.
class PreserveRandomState {
 public:
  PreserveRandomState();
  ~PreserveRandomState();
  PreserveRandomState(const PreserveRandomState&) = delete;
  PreserveRandomState& operator=(const PreserveRandomState&) = delete;

 private:
  std::vector<std::pair<Device, uint64_t>> offsets_;
};

// CRTP base that gives a module its deep clone(). Derived must be copy-constructible and rebuild all its
// registered members in reset().
template <typename Derived>
class Cloneable : public Module {
 public:
  using Module::Module;

  std::shared_ptr<Module> clone(const Device& device) const override {
    auto copy = std::make_shared<Derived>(static_cast<const Derived&>(*this));
    {
      PreserveRandomState keep_rng;
      copy->clear_registrations();
      copy->reset();
    }
    copy->to(device);
    copy->copy_state_from(*this);
    copy->train(is_training());
    return copy;
  }
};

// Clones and casts back: `auto replica = clone_module(*model, Device::cpu(1));`.
template <typename M>
std::shared_ptr<M> clone_module(const M& module, const Device& device) {
  return std::static_pointer_cast<M>(module.clone(device));
}

}  // namespace dpe::nn
