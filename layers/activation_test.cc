#include "layers/activation.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/ops.h"
#include "layers/containers.h"
#include "tests/testing/gradcheck.h"

namespace dpe::nn {
namespace {

TEST(ActivationTest, ModulesApplyTheirOps) {
  Tensor x = Tensor::from_vector(std::vector<float>{-2, -0.5, 0.5, 2}, {2, 2});
  EXPECT_TRUE(equal(ReLU().forward(x), relu(x)));
  EXPECT_TRUE(equal(GELU().forward(x), gelu(x)));
  EXPECT_TRUE(equal(SiLU().forward(x), silu(x)));
  EXPECT_TRUE(equal(Tanh().forward(x), tanh(x)));
  EXPECT_EQ(ReLU().forward(x).to_vector<float>(), (std::vector<float>{0, 0, 0.5, 2}));
  for (auto m : std::vector<std::shared_ptr<Module>>{std::make_shared<ReLU>(), std::make_shared<GELU>(),
                                                      std::make_shared<SiLU>(), std::make_shared<Tanh>(),
                                                      std::make_shared<Flatten>()}) {
    EXPECT_TRUE(m->parameters().empty()) << m->type_name();
    EXPECT_TRUE(m->state_dict().empty()) << m->type_name();
  }
}

TEST(ActivationTest, Flatten) {
  Tensor x = zeros({2, 3, 4, 5});
  EXPECT_EQ(Flatten().forward(x).shape(), (Shape{2, 60}));
  EXPECT_EQ(Flatten(0, -1).forward(x).shape(), (Shape{120}));
  EXPECT_EQ(Flatten(1, 2).forward(x).shape(), (Shape{2, 12, 5}));
  EXPECT_THROW(Flatten(2, 1).forward(x), Error);
  EXPECT_THROW(Flatten(1, 7).forward(x), Error);
}

TEST(ActivationTest, GradcheckInSequential) {
  Sequential seq({std::make_shared<GELU>(), std::make_shared<SiLU>(), std::make_shared<Tanh>(),
                  std::make_shared<ReLU>(), std::make_shared<Flatten>()});
  // ReLU's kink at 0: tanh(silu(gelu(x))) is 0 only at x = 0, so keep x away from 0.
  Tensor x = testing::randn_away_from({3, 2, 2}, 0.0, 0.1, 21);
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return seq.forward(in[0]); }, {x}), "");
  auto copy = seq.clone(Device::cpu(1));
  EXPECT_EQ(copy->forward(x.detach().to(Device::cpu(1))).shape(), (Shape{3, 4}));
}

}  // namespace
}  // namespace dpe::nn
