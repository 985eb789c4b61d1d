#include "layers/containers.h"

#include <algorithm>
#include <typeinfo>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops/conv.h"
#include "core/ops/pool.h"
#include "layers/activation.h"
#include "layers/checkpoint.h"
#include "layers/conv.h"
#include "layers/pooling.h"

namespace dpe::nn {

namespace {

std::shared_ptr<Module> child_at(const Module& m, size_t index) {
  auto children = m.children();
  DPE_CHECK(index < children.size(), m.type_name(), "[", index, "]: index out of range (size ", children.size(), ")");
  return children[index];
}

std::shared_ptr<Module> child_named(const Module& m, const std::string& key) {
  for (const auto& [name, child] : m.named_children()) {
    if (name == key) return child;
  }
  DPE_CHECK(false, m.type_name(), ": no key '", key, "'");
}

Tensor parameter_named(const Module& m, const std::string& key) {
  for (const auto& [name, p] : m.named_parameters(false)) {
    if (name == key) return p;
  }
  DPE_CHECK(false, m.type_name(), ": no key '", key, "'");
}

// A deep copy of a parameter on `device`, keeping requires_grad.
Tensor copy_parameter(const Tensor& p, const Device& device) {
  NoGradGuard no_grad;
  return p.detach().to(device).clone();
}

template <typename Container>
std::shared_ptr<Container> clone_children(const Container& source, const Device& device) {
  auto copy = std::make_shared<Container>();
  for (const auto& [name, child] : source.named_children()) copy->register_module(name, child->clone(device));
  copy->train(source.is_training());
  return copy;
}

}  // namespace

Sequential::Sequential(std::vector<std::shared_ptr<Module>> modules) : Sequential() {
  for (auto& m : modules) push_back(std::move(m));
}

void Sequential::push_back(std::shared_ptr<Module> module) {
  register_module(std::to_string(size()), std::move(module));
}

std::shared_ptr<Module> Sequential::operator[](size_t index) const { return child_at(*this, index); }

// Note [ReLU before MaxPool2d]
// max_pool2d(relu(x)) == relu(max_pool2d(x)), bit for bit, values and gradients: ReLU is monotonic, so the
// window's first maximum is the same element either way when it is positive (and gets dy), and its gradient is
// 0 either way when it is not; NaN is the maximum of a window and ReLU passes it on, so a NaN lands in the same
// place too. Pooling first runs the ReLU and its backward on a quarter of the elements (2 x 2 windows): the
// CNN's two ReLU -> MaxPool2d pairs were 13% of a step, both passes memory-bound. And max_pool2d_relu does both
// in the pool's one pass where the window-code kernels run and on CUDA devices (core/ops/pool.h), which removes
// the ReLU's passes (forward and backward, and on a GPU their launches) altogether. Only the exact module types
// are matched (a subclass may do something else; dpe modules have no hooks), so the pair's result is what its
// two forwards give.
//
// Note [Conv2d, ReLU and MaxPool2d(2)]
// A Conv2d -> ReLU -> MaxPool2d(2) triple runs as conv2d_relu_max_pool2d (core/ops/conv.h), which takes a first
// convolution (few products per output, CPU float32) in one pass each way (Note [Convolution, ReLU and pool in
// one pass], core/kernels/conv_pool.h) and composes the three ops otherwise: the CNN's first layer lost its
// largest activation and four passes over it. Unlike the pair above, the fused sums run in their own order, so
// the triple's values are the composition's to rounding, not bit for bit (as another convolution kernel's).
Tensor Sequential::forward(const Tensor& input) {
  const size_t n = size();
  if (checkpoint_segments_ <= 1 || !GradMode::is_enabled() || n < 2) return run(input, 0, n);
  const size_t segments = std::min(n, static_cast<size_t>(checkpoint_segments_));
  const std::vector<std::shared_ptr<Module>> modules = children();
  Tensor x = input;
  for (size_t s = 0; s < segments; ++s) {
    const size_t begin = n * s / segments, end = n * (s + 1) / segments;
    if (s + 1 == segments) return run(x, begin, end);  // its output is needed anyway (checkpoint_sequential's rule)
    std::vector<Module*> segment;
    for (size_t i = begin; i < end; ++i) segment.push_back(modules[i].get());
    x = checkpoint(segment, [this, begin, end](const std::vector<Tensor>& xs) { return run(xs[0], begin, end); }, {x});
  }
  return x;
}

void Sequential::set_checkpoint_segments(int64_t segments) {
  DPE_CHECK(segments >= 0, "Sequential::set_checkpoint_segments: ", segments, " segments; expected >= 0 (0: none)");
  checkpoint_segments_ = segments;
}

Tensor Sequential::run(const Tensor& input, size_t begin, size_t end) {
  Tensor x = input;
  const std::vector<std::shared_ptr<Module>> modules = children();
  auto is = [&](size_t i, const std::type_info& type) { return i < end && typeid(*modules[i]) == type; };
  for (size_t i = begin; i < end; ++i) {
    if (is(i, typeid(Conv2d)) && is(i + 1, typeid(ReLU)) && is(i + 2, typeid(MaxPool2d))) {
      const auto& conv = static_cast<const Conv2d&>(*modules[i]);
      const auto& pool = static_cast<const MaxPool2d&>(*modules[i + 2]);
      const std::array<int64_t, 2> two = {2, 2}, none = {0, 0};
      if (pool.kernel == two && pool.stride == two && pool.padding == none) {
        const Conv2dOptions& o = conv.options();
        conv.check_input(x);
        x = conv2d_relu_max_pool2d(x, conv.weight, conv.bias, o.stride, o.padding, o.dilation, o.groups);
        i += 2;
        continue;
      }
    }
    if (is(i, typeid(ReLU)) && is(i + 1, typeid(MaxPool2d))) {
      const auto& pool = static_cast<const MaxPool2d&>(*modules[i + 1]);
      x = max_pool2d_relu(x, pool.kernel, pool.stride, pool.padding);
      ++i;
      continue;
    }
    x = modules[i]->forward(x);
  }
  return x;
}

std::shared_ptr<Module> Sequential::clone(const Device& device) const {
  auto copy = clone_children(*this, device);
  copy->checkpoint_segments_ = checkpoint_segments_;
  return copy;
}

ModuleList::ModuleList(std::vector<std::shared_ptr<Module>> modules) : ModuleList() {
  for (auto& m : modules) push_back(std::move(m));
}

void ModuleList::push_back(std::shared_ptr<Module> module) {
  register_module(std::to_string(size()), std::move(module));
}

std::shared_ptr<Module> ModuleList::operator[](size_t index) const { return child_at(*this, index); }

std::shared_ptr<Module> ModuleList::clone(const Device& device) const { return clone_children(*this, device); }

void ModuleDict::insert(const std::string& key, std::shared_ptr<Module> module) {
  register_module(key, std::move(module));
}

bool ModuleDict::contains(const std::string& key) const {
  for (const auto& [name, child] : named_children()) {
    if (name == key) return true;
  }
  return false;
}

std::shared_ptr<Module> ModuleDict::operator[](const std::string& key) const { return child_named(*this, key); }

std::vector<std::string> ModuleDict::keys() const {
  std::vector<std::string> out;
  for (const auto& [name, child] : named_children()) out.push_back(name);
  return out;
}

std::shared_ptr<Module> ModuleDict::clone(const Device& device) const { return clone_children(*this, device); }

Tensor& ParameterList::append(Tensor value, bool requires_grad) {
  return register_parameter(std::to_string(size()), std::move(value), requires_grad);
}

Tensor ParameterList::operator[](size_t index) const {
  auto params = parameters(false);
  DPE_CHECK(index < params.size(), "ParameterList[", index, "]: index out of range (size ", params.size(), ")");
  return params[index];
}

std::shared_ptr<Module> ParameterList::clone(const Device& device) const {
  auto copy = std::make_shared<ParameterList>();
  for (const Tensor& p : parameters(false)) copy->append(copy_parameter(p, device), p.requires_grad());
  copy->train(is_training());
  return copy;
}

Tensor& ParameterDict::insert(const std::string& key, Tensor value, bool requires_grad) {
  return register_parameter(key, std::move(value), requires_grad);
}

bool ParameterDict::contains(const std::string& key) const {
  for (const auto& [name, p] : named_parameters(false)) {
    if (name == key) return true;
  }
  return false;
}

Tensor ParameterDict::operator[](const std::string& key) const { return parameter_named(*this, key); }

std::vector<std::string> ParameterDict::keys() const {
  std::vector<std::string> out;
  for (const auto& [name, p] : named_parameters(false)) out.push_back(name);
  return out;
}

std::shared_ptr<Module> ParameterDict::clone(const Device& device) const {
  auto copy = std::make_shared<ParameterDict>();
  for (const auto& [name, p] : named_parameters(false)) copy->insert(name, copy_parameter(p, device), p.requires_grad());
  copy->train(is_training());
  return copy;
}

}  // namespace dpe::nn
