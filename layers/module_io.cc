#include "layers/module_io.h"

#include "core/error.h"

namespace dpe::nn {

namespace {
const char* kind_of(const Argument& a) {
  static const char* names[] = {"a tensor", "an int64", "a double", "a bool", "a string"};
  return names[a.index()];
}
}  // namespace

const Tensor& ModuleInput::tensor(size_t index) const {
  DPE_CHECK(index < args.size(), "input has ", args.size(), " positional arguments, asked for argument ", index);
  DPE_CHECK(std::holds_alternative<Tensor>(args[index]), "positional argument ", index, " is ", kind_of(args[index]),
            ", expected a tensor");
  return std::get<Tensor>(args[index]);
}

const Tensor& ModuleInput::tensor(const std::string& name) const {
  return value<Tensor>(name);
}

template <typename T>
const T& ModuleInput::value(const std::string& name) const {
  auto it = kwargs.find(name);
  DPE_CHECK(it != kwargs.end(), "input has no argument named '", name, "'");
  DPE_CHECK(std::holds_alternative<T>(it->second), "argument '", name, "' is ", kind_of(it->second),
            ", expected ", kind_of(Argument(T{})));
  return std::get<T>(it->second);
}

template const Tensor& ModuleInput::value(const std::string&) const;
template const int64_t& ModuleInput::value(const std::string&) const;
template const double& ModuleInput::value(const std::string&) const;
template const bool& ModuleInput::value(const std::string&) const;
template const std::string& ModuleInput::value(const std::string&) const;

}  // namespace dpe::nn
