// Structured module inputs: positional and named arguments, each a tensor or a plain value.
//
// DataParallel splits every tensor argument along the batch dimension (all with the same size there, or
// it is an error before anything runs) and passes every other value unchanged to each replica.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "core/tensor.h"

namespace dpe::nn {

using Argument = std::variant<Tensor, int64_t, double, bool, std::string>;

struct ModuleInput {
  std::vector<Argument> args;
  std::map<std::string, Argument> kwargs;

  ModuleInput() = default;
  ModuleInput(Tensor x) { args.emplace_back(std::move(x)); }  // NOLINT: a tensor is the common input
  ModuleInput(std::vector<Argument> positional, std::map<std::string, Argument> named = {})
      : args(std::move(positional)), kwargs(std::move(named)) {}

  // Typed access; throw naming the argument and what it holds when the type differs or it is absent.
  const Tensor& tensor(size_t index) const;
  const Tensor& tensor(const std::string& name) const;
  template <typename T>
  const T& value(const std::string& name) const;
  bool has(const std::string& name) const { return kwargs.count(name) > 0; }
};

}  // namespace dpe::nn
