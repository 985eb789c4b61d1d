#include "layers/dropout.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/ops.h"
#include "layers/containers.h"

namespace dpe::nn {
namespace {

TEST(DropoutTest, TrainScalesEvalIsIdentity) {
  manual_seed(0);
  Dropout drop(0.25);
  Tensor x = ones({1000});
  std::vector<float> y = drop.forward(x).to_vector<float>();
  int kept = 0;
  for (float v : y) {
    ASSERT_TRUE(v == 0.0f || std::abs(v - 1.0f / 0.75f) < 1e-6f) << v;
    kept += v != 0.0f;
  }
  // Binomial(1000, 0.75): sd 13.7; 6 sd either side.
  EXPECT_NEAR(kept, 750, 82);
  drop.eval();
  EXPECT_TRUE(drop.forward(x).is_same(x));
}

TEST(DropoutTest, ProbabilityIsChecked) {
  EXPECT_THROW(Dropout(1.5), Error);
  EXPECT_THROW(Dropout(-0.1), Error);
  Dropout all(1.0);
  EXPECT_EQ(all.forward(ones({4})).to_vector<float>(), (std::vector<float>{0, 0, 0, 0}));
}

TEST(DropoutTest, ClonesIntoSequential) {
  Sequential seq({std::make_shared<Dropout>(0.5)});
  auto copy = seq.clone(Device::cpu(1));
  copy->eval();
  Tensor x = ones({3}, Device::cpu(1));
  EXPECT_TRUE(copy->forward(x).is_same(x));
}

}  // namespace
}  // namespace dpe::nn
