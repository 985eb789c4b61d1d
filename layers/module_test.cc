#include "layers/module.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/autograd/node.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops/conv.h"
#include "core/ops/pool.h"
#include "layers/containers.h"
#include "layers/activation.h"
#include "layers/conv.h"
#include "layers/linear.h"
#include "layers/pooling.h"
#include "tests/testing/errors.h"

namespace dpe::nn {
namespace {

class Mlp : public Cloneable<Mlp> {
 public:
  Mlp() : Cloneable("Mlp") { reset(); }
  void reset() override {
    fc1 = register_module("fc1", std::make_shared<Linear>(4, 8));
    fc2 = register_module("fc2", std::make_shared<Linear>(8, 2));
    scale = register_buffer("scale", ones({2}));
  }
  Tensor forward(const Tensor& x) override { return fc2->forward(relu(fc1->forward(x))) * scale; }
  std::shared_ptr<Linear> fc1, fc2;
  Tensor scale;
};

using dpe::testing::error_of;

TEST(ModuleTest, NamesAreDottedInRegistrationOrder) {
  Mlp m;
  std::vector<std::string> names;
  for (const auto& [name, t] : m.state_dict()) names.push_back(name);
  // PyTorch's order: own parameters, own buffers, then children.
  EXPECT_EQ(names, (std::vector<std::string>{"scale", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}));
  EXPECT_EQ(m.parameters().size(), 4u);
  EXPECT_EQ(m.buffers().size(), 1u);
  EXPECT_EQ(m.children().size(), 2u);
  EXPECT_EQ(m.modules().size(), 3u);
  EXPECT_TRUE(m.parameters()[0].requires_grad());
  EXPECT_FALSE(m.buffers()[0].requires_grad());
}

TEST(ModuleTest, RegistrationErrors) {
  Mlp m;
  EXPECT_NE(error_of([&] { m.register_parameter("fc1", zeros({1})); }).find("name 'fc1' is already registered"),
            std::string::npos);
  EXPECT_NE(error_of([&] { m.register_buffer("a.b", zeros({1})); }).find("invalid name 'a.b'"), std::string::npos);
  EXPECT_NE(error_of([&] { Linear(0, 3); }).find("feature counts must be positive"), std::string::npos);
  EXPECT_NE(error_of([&] { m.fc1->forward(zeros({2, 5})); }).find("expected input (..., 4), got [2, 5]"),
            std::string::npos);
}

TEST(ModuleTest, ReplaceModuleKeepsThePosition) {
  Sequential seq({std::make_shared<Linear>(4, 8), std::make_shared<Linear>(8, 2)});
  auto replacement = std::make_shared<Linear>(4, 8, /*bias=*/false);
  EXPECT_EQ(seq.replace_module("0", replacement), replacement);
  EXPECT_EQ(seq[0], replacement);  // Sequential reads the registry: forward uses the new child
  std::vector<std::string> names;
  for (const auto& [name, t] : seq.state_dict()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "1.weight", "1.bias"}));
  EXPECT_EQ(seq.forward(zeros({3, 4})).shape(), (Shape{3, 2}));
  // A typed member is the parent's to reassign (the registry alone changes).
  Mlp m;
  m.fc2 = m.replace_module("fc2", std::make_shared<Linear>(8, 2));
  EXPECT_EQ(m.children()[1], m.fc2);
  EXPECT_NE(error_of([&] { m.replace_module("fc3", std::make_shared<Linear>(8, 2)); })
                .find("Mlp: no child module 'fc3' to replace (children: fc1, fc2)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { m.replace_module("fc1", std::shared_ptr<Linear>()); }).find("is null"), std::string::npos);
}

TEST(ModuleTest, CloneIsADeepCopyOnTheTargetDevice) {
  manual_seed(3);
  Mlp m;
  auto replica = clone_module(m, Device::cpu(1));
  EXPECT_NE(replica->fc1, m.fc1);
  StateDict a = m.state_dict(), b = replica->state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(b[i].second.device(), Device::cpu(1));
    EXPECT_NE(a[i].second.storage(), b[i].second.storage()) << a[i].first;
    EXPECT_TRUE(equal(a[i].second, b[i].second)) << a[i].first;
    EXPECT_EQ(a[i].second.requires_grad(), b[i].second.requires_grad());
  }
  // The member handles of the clone are its registered tensors.
  EXPECT_EQ(replica->fc1->weight.storage(), b[1].second.storage());
  EXPECT_EQ(b[1].first, "fc1.weight");
  Tensor x = randn({3, 4});
  EXPECT_TRUE(allclose(replica->forward(x.to(Device::cpu(1))), m.forward(x), 0, 0));
  // Gradients of the replica are its own.
  sum(replica->forward(x.to(Device::cpu(1)))).backward();
  EXPECT_TRUE(replica->fc1->weight.grad().defined());
  EXPECT_FALSE(m.fc1->weight.grad().defined());
}

// Regression: a clone's parameters all came back with requires_grad true, so a frozen parameter was
// trainable on every DataParallel replica but the master.
TEST(ModuleTest, CloneKeepsFrozenParametersFrozen) {
  Mlp m;
  m.fc1->weight.set_requires_grad(false);
  m.fc2->bias.set_requires_grad(false);
  auto replica = clone_module(m, Device::cpu(1));
  for (const auto& [name, p] : replica->named_parameters()) {
    EXPECT_EQ(p.requires_grad(), name != "fc1.weight" && name != "fc2.bias") << name;
  }
  EXPECT_FALSE(replica->scale.requires_grad());  // buffers stay out of autograd
}

TEST(ModuleTest, CloneDoesNotShiftTheRandomStream) {
  manual_seed(11);
  Mlp m;
  Tensor expected = randn({5});
  manual_seed(11);
  Mlp m2;
  m2.clone(Device::cpu(1));
  EXPECT_TRUE(equal(randn({5}), expected));
}

TEST(ModuleTest, ContainersReplicateEveryEntry) {
  auto params = std::make_shared<ParameterList>();
  params->append(ones({2}));
  params->append(full({3}, 2.0));
  auto dict = std::make_shared<ParameterDict>();
  dict->insert("alpha", full({1}, 0.5));
  Sequential seq({std::make_shared<Linear>(4, 3), std::make_shared<Linear>(3, 2)});
  ModuleList list({params, dict});
  // PyTorch's DataParallel replicas lose ParameterList/Dict entries (pytorch#36035); dpe's must not.
  auto list_copy = std::static_pointer_cast<ModuleList>(list.clone(Device::cpu(1)));
  auto params_copy = std::static_pointer_cast<ParameterList>((*list_copy)[0]);
  auto dict_copy = std::static_pointer_cast<ParameterDict>((*list_copy)[1]);
  ASSERT_EQ(params_copy->size(), 2u);
  EXPECT_TRUE(equal((*params_copy)[1], full({3}, 2.0)));
  EXPECT_EQ((*params_copy)[1].device(), Device::cpu(1));
  EXPECT_TRUE((*params_copy)[1].requires_grad());
  EXPECT_EQ(dict_copy->keys(), (std::vector<std::string>{"alpha"}));
  EXPECT_EQ((*dict_copy)["alpha"].item(), 0.5);
  EXPECT_EQ(list_copy->state_dict().size(), 3u);
  auto seq_copy = seq.clone(Device::cpu(1));
  Tensor x = randn({2, 4});
  EXPECT_TRUE(allclose(seq_copy->forward(x.to(Device::cpu(1))), seq.forward(x), 0, 0));
  EXPECT_EQ(seq.state_dict()[2].first, "1.weight");
  EXPECT_NE(error_of([&] { (*dict)["beta"]; }).find("no key 'beta'"), std::string::npos);
}

TEST(ModuleTest, StateDictRoundTripAndStrictErrors) {
  Mlp a, b;
  b.load_state_dict(a.state_dict());
  for (size_t i = 0; i < a.state_dict().size(); ++i) EXPECT_TRUE(equal(a.state_dict()[i].second, b.state_dict()[i].second));

  StateDict broken = a.state_dict();  // scale, fc1.weight, fc1.bias, fc2.weight, fc2.bias
  broken.erase(broken.begin() + 1);          // missing fc1.weight
  broken.emplace_back("extra", zeros({1}));  // unexpected
  broken[1].second = zeros({9});             // fc1.bias mis-shaped
  Tensor before = b.fc2->weight.clone();
  std::string message = error_of([&] { b.load_state_dict(broken); });
  EXPECT_NE(message.find("missing keys: fc1.weight"), std::string::npos) << message;
  EXPECT_NE(message.find("unexpected keys: extra"), std::string::npos) << message;
  EXPECT_NE(message.find("fc1.bias (checkpoint [9], model [8])"), std::string::npos) << message;
  EXPECT_TRUE(equal(b.fc2->weight, before));  // nothing loaded
  broken[1].second = zeros({8});
  b.load_state_dict(broken, /*strict=*/false);  // missing/unexpected tolerated
  EXPECT_EQ(b.fc1->bias.to_vector<float>(), std::vector<float>(8, 0.0f));
}

TEST(ModuleTest, TrainEvalToZeroGrad) {
  Mlp m;
  m.eval();
  EXPECT_FALSE(m.fc1->is_training());
  m.train();
  EXPECT_TRUE(m.fc2->is_training());
  sum(m.forward(ones({1, 4}))).backward();
  Tensor handle = m.fc1->weight;  // a handle held elsewhere (an optimizer) stays valid across to()
  m.to(Device::cpu(1));
  EXPECT_EQ(handle.device(), Device::cpu(1));
  EXPECT_EQ(handle.grad().device(), Device::cpu(1));
  EXPECT_EQ(m.device(), Device::cpu(1));
  m.zero_grad(/*set_to_none=*/false);
  EXPECT_EQ(sum(handle.grad()).item(), 0.0);
  m.zero_grad();
  EXPECT_FALSE(handle.grad().defined());
  m.to(DType::Float64);
  EXPECT_EQ(handle.dtype(), DType::Float64);
}

// Note [ReLU before MaxPool2d] (containers.cc): Sequential pools before the ReLU, and values and gradients are
// bit for bit those of ReLU then MaxPool2d, with ties, windows of negatives and zeros, -0.0, infinities, NaN
// and padding; the swap shows in the graph (the output's node is the ReLU's).
TEST(ModuleTest, SequentialPoolsBeforeTheReluWithTheSameBits) {
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  Tensor x = randn({2, 3, 6, 6}, DType::Float64);
  std::vector<double> v = x.to_vector<double>();
  const std::vector<double> specials = {nan, -1, -2, -3, 0, -0.0, 0, -5, 2, 2, 2, -1, inf, -inf, -inf, -inf};
  std::copy(specials.begin(), specials.end(), v.begin());
  v[40] = v[41] = v[46] = 1.5;  // a tie of positive maxima
  x = Tensor::from_vector(v, x.shape());
  for (int64_t padding : {0, 1}) {
    SCOPED_TRACE(padding);
    Tensor a = x.clone().set_requires_grad(true), b = x.clone().set_requires_grad(true);
    Sequential seq({std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2 + padding, 2, padding)});
    Tensor got = seq.forward(a);
    Tensor want = max_pool2d(relu(b), {2 + padding, 2 + padding}, {2, 2}, {padding, padding});
    EXPECT_EQ(got.grad_fn()->name(), "ReluBackward");
    const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
    ASSERT_EQ(g.size(), w.size());
    for (size_t i = 0; i < g.size(); ++i) {
      EXPECT_TRUE(std::memcmp(&g[i], &w[i], sizeof(double)) == 0 || (std::isnan(g[i]) && std::isnan(w[i])))
          << "output " << i << ": " << g[i] << " vs " << w[i];
    }
    Tensor dy = randn(got.shape(), DType::Float64);
    got.backward(dy);
    want.backward(dy);
    EXPECT_TRUE(equal(a.grad(), b.grad())) << max_abs_diff(a.grad(), b.grad());
  }
}

// Note [Conv2d, ReLU and MaxPool2d(2)] (containers.cc): the triple runs as conv2d_relu_max_pool2d, the
// modules' values and gradients to rounding; another pool, or a module between them, runs module by module.
TEST(ModuleTest, SequentialRunsConvReluMaxPoolAsOneOp) {
  auto conv = std::make_shared<Conv2d>(1, 16, 3, 1, 1);
  Sequential seq({conv, std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2)});
  const Tensor x = randn({3, 1, 10, 12});
  Tensor got = seq.forward(x);
  EXPECT_EQ(got.grad_fn()->name(), "ConvReluMaxPoolBackward");
  Tensor weight = conv->weight.detach().clone().set_requires_grad(true);
  Tensor bias = conv->bias.detach().clone().set_requires_grad(true);
  Tensor want = max_pool2d(relu(conv2d(x, weight, bias, {1, 1}, {1, 1})), {2, 2});
  EXPECT_LT(max_abs_diff(got, want), 1e-5);
  const Tensor dy = randn(got.shape());
  got.backward(dy);
  want.backward(dy);
  EXPECT_LT(max_abs_diff(conv->weight.grad(), weight.grad()), 1e-4);
  EXPECT_LT(max_abs_diff(conv->bias.grad(), bias.grad()), 1e-4);

  Sequential other_pool({conv, std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(3)});
  EXPECT_NE(other_pool.forward(x).grad_fn()->name(), "ConvReluMaxPoolBackward");
  Sequential apart({conv, std::make_shared<Tanh>(), std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2)});
  EXPECT_NE(apart.forward(x).grad_fn()->name(), "ConvReluMaxPoolBackward");
  // The module's own input check still speaks.
  try {
    seq.forward(randn({3, 2, 10, 12}));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Conv2d(1, 16): expected input (N, C_in=1, H, W), got [3, 2, 10, 12]"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dpe::nn
