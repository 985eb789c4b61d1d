#include "layers/normalization.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops.h"
#include "tests/testing/golden.h"
#include "tests/testing/gradcheck.h"

namespace dpe::nn {
namespace {

using testing::max_relative_error;

TEST(LayerNormTest, NormalisesTrailingDims) {
  LayerNorm ln({2});
  EXPECT_EQ(ln.weight.to_vector<float>(), (std::vector<float>{1, 1}));
  EXPECT_EQ(ln.bias.to_vector<float>(), (std::vector<float>{0, 0}));
  Tensor y = ln.forward(Tensor::from_vector(std::vector<float>{1, 3, 10, 0}, {2, 2}));
  std::vector<float> got = y.to_vector<float>();
  // Row {1, 3}: mean 2, biased var 1. Row {10, 0}: mean 5, var 25.
  EXPECT_NEAR(got[0], -1 / std::sqrt(1 + 1e-5), 1e-6);
  EXPECT_NEAR(got[1], 1 / std::sqrt(1 + 1e-5), 1e-6);
  EXPECT_NEAR(got[2], 5 / std::sqrt(25 + 1e-5), 1e-6);
  LayerNorm plain({3}, 1e-5, /*elementwise_affine=*/false);
  EXPECT_TRUE(plain.parameters().empty());
}

TEST(LayerNormTest, ShapeErrors) {
  LayerNorm ln({4, 5});
  try {
    ln.forward(zeros({3, 5, 4}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not end with normalized_shape [4, 5]"), std::string::npos) << e.what();
  }
}

TEST(LayerNormTest, Gradcheck) {
  LayerNorm ln({3, 4});
  ln.to(DType::Float64);
  {
    NoGradGuard no_grad;
    ln.weight.copy_(randn({3, 4}, DType::Float64));
    ln.bias.copy_(randn({3, 4}, DType::Float64));
  }
  Tensor x = testing::randn_leaf({2, 3, 4}, 11);
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return ln.forward(in[0]); },
                               {x, ln.weight, ln.bias}),
            "");
}

TEST(LayerNormTest, MatchesPyTorch) {
  testing::Golden g = testing::load_golden("layernorm");  // tests/golden/gen_norm.py
  LayerNorm ln({4, 5});
  ln.to(DType::Float64);
  {
    NoGradGuard no_grad;
    ln.weight.copy_(g.tensor("weight"));
    ln.bias.copy_(g.tensor("bias"));
  }
  Tensor x = g.tensor("x").clone().set_requires_grad(true);
  Tensor y = ln.forward(x);
  y.backward(g.tensor("dy"));
  // float64 on both sides: only summation order differs.
  EXPECT_LT(max_relative_error(y, g.tensor("y")), 1e-10);
  EXPECT_LT(max_relative_error(x.grad(), g.tensor("dx")), 1e-10);
  EXPECT_LT(max_relative_error(ln.weight.grad(), g.tensor("dweight")), 1e-10);
  EXPECT_LT(max_relative_error(ln.bias.grad(), g.tensor("dbias")), 1e-10);
}

TEST(LayerNormTest, MatchesPyTorchFloat32) {
  testing::Golden g = testing::load_golden("layernorm_f32");
  LayerNorm ln({8});
  Tensor x = g.tensor("x").clone().set_requires_grad(true);
  Tensor y = ln.forward(x);
  y.backward(g.tensor("dy"));
  EXPECT_LT(max_relative_error(y, g.tensor("y")), 1e-5);
  EXPECT_LT(max_relative_error(x.grad(), g.tensor("dx"), 1e-5), 1e-5);
  EXPECT_LT(max_relative_error(ln.weight.grad(), g.tensor("dweight"), 1e-5), 1e-5);
  EXPECT_LT(max_relative_error(ln.bias.grad(), g.tensor("dbias"), 1e-5), 1e-5);
}

TEST(RMSNormTest, ValuesAndInit) {
  RMSNorm norm(2);
  EXPECT_EQ(norm.weight.to_vector<float>(), (std::vector<float>{1, 1}));
  EXPECT_EQ(norm.eps(), 1e-6);
  // {3, 4}: mean of squares 12.5.
  std::vector<float> got = norm.forward(Tensor::from_vector(std::vector<float>{3, 4}, {1, 2})).to_vector<float>();
  EXPECT_NEAR(got[0], 3 / std::sqrt(12.5 + 1e-6), 1e-6);
  EXPECT_NEAR(got[1], 4 / std::sqrt(12.5 + 1e-6), 1e-6);
  EXPECT_THROW(norm.forward(zeros({2, 3})), Error);
}

TEST(RMSNormTest, Gradcheck) {
  RMSNorm norm(5, 1e-5);
  norm.to(DType::Float64);
  {
    NoGradGuard no_grad;
    norm.weight.copy_(randn({5}, DType::Float64));
  }
  Tensor x = testing::randn_leaf({3, 2, 5}, 12);
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return norm.forward(in[0]); }, {x, norm.weight}),
            "");
}

TEST(RMSNormTest, MatchesPyTorch) {
  testing::Golden g = testing::load_golden("rmsnorm");  // hand-written reference in gen_norm.py
  RMSNorm norm(6);
  norm.to(DType::Float64);
  {
    NoGradGuard no_grad;
    norm.weight.copy_(g.tensor("weight"));
  }
  Tensor x = g.tensor("x").clone().set_requires_grad(true);
  Tensor y = norm.forward(x);
  y.backward(g.tensor("dy"));
  EXPECT_LT(max_relative_error(y, g.tensor("y")), 1e-10);
  EXPECT_LT(max_relative_error(x.grad(), g.tensor("dx")), 1e-10);
  EXPECT_LT(max_relative_error(norm.weight.grad(), g.tensor("dweight")), 1e-10);
}

TEST(NormalizationTest, CudaMatchesCpu) {
  if (!dpe::cuda_available()) GTEST_SKIP() << "no CUDA device";
  manual_seed(5);
  LayerNorm ln({16});
  RMSNorm rms(16);
  Tensor x = randn({4, 16}) * 3.0;
  Tensor xg = x.to(Device::cuda(0));
  auto ln_gpu = clone_module(ln, Device::cuda(0));
  auto rms_gpu = clone_module(rms, Device::cuda(0));
  // float32, different summation orders: a few ulps.
  EXPECT_LT(max_relative_error(ln_gpu->forward(xg).to(Device::cpu(0)), ln.forward(x), 1e-3), 1e-4);
  EXPECT_LT(max_relative_error(rms_gpu->forward(xg).to(Device::cpu(0)), rms.forward(x), 1e-3), 1e-4);
}

}  // namespace
}  // namespace dpe::nn
