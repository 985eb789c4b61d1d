// Containers: Sequential, ModuleList, ModuleDict, ParameterList, ParameterDict.
//
// They clone child by child (no reset()), so replicas keep every element: PyTorch's DataParallel loses
// ParameterList/ParameterDict entries in replicas (pytorch#36035); dpe's clone copies them like any other
// parameter. Children are named "0", "1", ... (lists) or by key (dicts), as in PyTorch's state_dict.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "layers/module.h"

namespace dpe::nn {

// Applies its children in order; each child must implement forward(const Tensor&).
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  explicit Sequential(std::vector<std::shared_ptr<Module>> modules);

  void push_back(std::shared_ptr<Module> module);
  size_t size() const { return children().size(); }
  std::shared_ptr<Module> operator[](size_t index) const;
  Tensor forward(const Tensor& input) override;
  std::shared_ptr<Module> clone(const Device& device) const override;
  // Activation checkpointing (torch.utils.checkpoint.checkpoint_sequential): with grad mode on, the children
  // run as `segments` runs of consecutive children, each but the last under nn::checkpoint (layers/checkpoint.h),
  // which keeps only its input; 0 (the default) or 1: none. Clones keep it.
  void set_checkpoint_segments(int64_t segments);
  int64_t checkpoint_segments() const { return checkpoint_segments_; }

 private:
  Tensor run(const Tensor& input, size_t begin, size_t end);  // children [begin, end)
  int64_t checkpoint_segments_ = 0;
};

class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  explicit ModuleList(std::vector<std::shared_ptr<Module>> modules);

  void push_back(std::shared_ptr<Module> module);
  size_t size() const { return children().size(); }
  std::shared_ptr<Module> operator[](size_t index) const;
  std::shared_ptr<Module> clone(const Device& device) const override;
};

class ModuleDict : public Module {
 public:
  ModuleDict() : Module("ModuleDict") {}

  void insert(const std::string& key, std::shared_ptr<Module> module);
  bool contains(const std::string& key) const;
  std::shared_ptr<Module> operator[](const std::string& key) const;  // throws naming the missing key
  std::vector<std::string> keys() const;
  std::shared_ptr<Module> clone(const Device& device) const override;
};

class ParameterList : public Module {
 public:
  ParameterList() : Module("ParameterList") {}

  // Registers `value` as parameter str(size()) and returns its handle.
  Tensor& append(Tensor value, bool requires_grad = true);
  size_t size() const { return parameters(false).size(); }
  Tensor operator[](size_t index) const;
  std::shared_ptr<Module> clone(const Device& device) const override;
};

class ParameterDict : public Module {
 public:
  ParameterDict() : Module("ParameterDict") {}

  Tensor& insert(const std::string& key, Tensor value, bool requires_grad = true);
  bool contains(const std::string& key) const;
  Tensor operator[](const std::string& key) const;
  std::vector<std::string> keys() const;
  std::shared_ptr<Module> clone(const Device& device) const override;
};

}  // namespace dpe::nn
