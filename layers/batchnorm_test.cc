#include "layers/batchnorm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops.h"
#include "tests/testing/golden.h"
#include "tests/testing/gradcheck.h"
#include "tests/testing/errors.h"

namespace dpe::nn {
namespace {

using testing::max_relative_error;

std::vector<std::string> names_of(const StateDict& state) {
  std::vector<std::string> names;
  for (const auto& [name, tensor] : state) names.push_back(name);
  return names;
}

using dpe::testing::error_of;

TEST(BatchNormTest, DefaultsMatchPyTorch) {
  BatchNorm2d bn(3);
  EXPECT_EQ(names_of(bn.state_dict()),
            (std::vector<std::string>{"weight", "bias", "running_mean", "running_var", "num_batches_tracked"}));
  EXPECT_EQ(bn.parameters().size(), 2u);
  EXPECT_EQ(bn.weight.to_vector<float>(), (std::vector<float>{1, 1, 1}));
  EXPECT_EQ(bn.bias.to_vector<float>(), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(bn.running_mean.to_vector<float>(), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(bn.running_var.to_vector<float>(), (std::vector<float>{1, 1, 1}));
  EXPECT_EQ(bn.num_batches_tracked.dtype(), DType::Int64);
  EXPECT_EQ(bn.num_batches_tracked.dim(), 0);
  EXPECT_EQ(bn.num_batches_tracked.item(), 0.0);
  EXPECT_TRUE(bn.weight.requires_grad());
  EXPECT_FALSE(bn.running_mean.requires_grad());
}

TEST(BatchNormTest, RunningStatsUpdateByHand) {
  // One channel of values {1, 2, 3, 6}: mean 3, biased var 3.5, unbiased var 14/3.
  BatchNorm1d bn(1, 1e-5, 0.25);
  Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3, 6}, {4, 1});
  Tensor y = bn.forward(x);
  EXPECT_NEAR(bn.running_mean.item(), 0.75 * 0 + 0.25 * 3, 1e-6);
  EXPECT_NEAR(bn.running_var.item(), 0.75 * 1 + 0.25 * 14.0 / 3.0, 1e-6);
  EXPECT_EQ(bn.num_batches_tracked.item(), 1.0);
  // Normalised with the biased variance.
  std::vector<float> got = y.to_vector<float>();
  const double invstd = 1.0 / std::sqrt(3.5 + 1e-5);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(got[i], (std::vector<double>{1, 2, 3, 6}[i] - 3) * invstd, 1e-6);
  bn.forward(x);
  EXPECT_NEAR(bn.running_mean.item(), 0.75 * 0.75 + 0.25 * 3, 1e-6);
  EXPECT_EQ(bn.num_batches_tracked.item(), 2.0);
}

TEST(BatchNormTest, EvalUsesRunningStatsAndLeavesThemAlone) {
  BatchNorm1d bn(2);
  {
    NoGradGuard no_grad;
    bn.running_mean.copy_(Tensor::from_vector(std::vector<float>{1, -1}, {2}));
    bn.running_var.copy_(Tensor::from_vector(std::vector<float>{4, 0.25}, {2}));
    bn.weight.copy_(Tensor::from_vector(std::vector<float>{2, 3}, {2}));
    bn.bias.copy_(Tensor::from_vector(std::vector<float>{10, 20}, {2}));
  }
  bn.eval();
  Tensor y = bn.forward(Tensor::from_vector(std::vector<float>{3, 0}, {1, 2}));  // N = 1 is fine in eval
  std::vector<float> got = y.to_vector<float>();
  EXPECT_NEAR(got[0], (3 - 1) / std::sqrt(4 + 1e-5) * 2 + 10, 1e-5);
  EXPECT_NEAR(got[1], (0 + 1) / std::sqrt(0.25 + 1e-5) * 3 + 20, 1e-5);
  EXPECT_EQ(bn.running_mean.to_vector<float>(), (std::vector<float>{1, -1}));
  EXPECT_EQ(bn.num_batches_tracked.item(), 0.0);
}

TEST(BatchNormTest, NoAffineNoTracking) {
  BatchNorm1d bn(2, 1e-5, 0.1, /*affine=*/false, /*track_running_stats=*/false);
  EXPECT_TRUE(bn.state_dict().empty());
  EXPECT_FALSE(bn.weight.defined());
  bn.eval();  // without running stats, eval normalises with the batch's statistics (like PyTorch)
  Tensor y = bn.forward(Tensor::from_vector(std::vector<float>{1, 5, 3, 7}, {2, 2}));
  std::vector<float> got = y.to_vector<float>();
  EXPECT_NEAR(got[0], -1.0, 1e-4);
  EXPECT_NEAR(got[2], 1.0, 1e-4);
}

TEST(BatchNormTest, InputChecks) {
  BatchNorm1d bn1(3);
  BatchNorm2d bn2(3);
  EXPECT_NE(error_of([&] { bn1.forward(zeros({2, 3, 4, 4})); }).find("expected 2D or 3D input"), std::string::npos);
  EXPECT_NE(error_of([&] { bn2.forward(zeros({2, 3, 4})); }).find("expected 4D input (N, C, H, W), got 3D"),
            std::string::npos);
  EXPECT_NE(error_of([&] { bn2.forward(zeros({2, 5, 4, 4})); }).find("expected 3 channels at dim 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { bn1.forward(zeros({1, 3})); }).find("more than 1 value per channel"), std::string::npos);
  EXPECT_NE(error_of([] { BatchNorm1d bad(0); }).find("num_features must be positive"), std::string::npos);
}

TEST(BatchNormTest, CloneCopiesBuffers) {
  BatchNorm1d bn(2);
  bn.forward(randn({8, 2}));
  auto replica = clone_module(bn, Device::cpu(1));
  EXPECT_EQ(replica->running_mean.device(), Device::cpu(1));
  EXPECT_TRUE(equal(replica->running_mean.to(Device::cpu(0)), bn.running_mean));
  EXPECT_EQ(replica->num_batches_tracked.item(), 1.0);
  EXPECT_EQ(replica->num_batches_tracked.dtype(), DType::Int64);
  // The replica's buffers are its own.
  replica->forward(randn({8, 2}, Device::cpu(1)));
  EXPECT_EQ(bn.num_batches_tracked.item(), 1.0);
}

TEST(BatchNormTest, GradcheckTraining2dAnd4d) {
  BatchNorm1d bn1(3);
  bn1.to(DType::Float64);
  {
    NoGradGuard no_grad;
    bn1.weight.copy_(Tensor::from_vector(std::vector<double>{0.5, 1.5, -2}, {3}));
    bn1.bias.copy_(Tensor::from_vector(std::vector<double>{0.1, -0.2, 0.3}, {3}));
  }
  Tensor x1 = testing::randn_leaf({5, 3}, 1);
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return bn1.forward(in[0]); },
                               {x1, bn1.weight, bn1.bias}),
            "");
  Tensor x3 = testing::randn_leaf({3, 3, 4}, 2);  // (N, C, L)
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return bn1.forward(in[0]); },
                               {x3, bn1.weight, bn1.bias}),
            "");
  BatchNorm2d bn2(2);
  bn2.to(DType::Float64);
  Tensor x4 = testing::randn_leaf({3, 2, 3, 3}, 3);
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return bn2.forward(in[0]); },
                               {x4, bn2.weight, bn2.bias}),
            "");
}

TEST(BatchNormTest, GradcheckEval2dAnd4d) {
  BatchNorm1d bn1(3);
  bn1.to(DType::Float64);
  bn1.forward(testing::randn_leaf({6, 3}, 4).detach());  // non-trivial running stats
  bn1.eval();
  Tensor x1 = testing::randn_leaf({2, 3}, 5);
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return bn1.forward(in[0]); },
                               {x1, bn1.weight, bn1.bias}),
            "");
  BatchNorm2d bn2(2);
  bn2.to(DType::Float64);
  bn2.forward(testing::randn_leaf({2, 2, 3, 3}, 6).detach());
  bn2.eval();
  Tensor x4 = testing::randn_leaf({2, 2, 2, 3}, 7);
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return bn2.forward(in[0]); },
                               {x4, bn2.weight, bn2.bias}),
            "");
}

// Two training steps, then eval, against tests/golden/gen_norm.py.
template <typename BN>
void check_golden(BN& bn, const std::string& fixture) {
  SCOPED_TRACE(fixture);
  testing::Golden g = testing::load_golden(fixture);
  bn.to(DType::Float64);
  {
    NoGradGuard no_grad;
    bn.weight.copy_(g.tensor("weight"));
    bn.bias.copy_(g.tensor("bias"));
  }
  // float64 on both sides: only summation order differs.
  constexpr double kTol = 1e-10;
  for (int step = 0; step < 2; ++step) {
    const std::string s = std::to_string(step);
    bn.zero_grad();
    Tensor x = g.tensor("x" + s).clone().set_requires_grad(true);
    Tensor y = bn.forward(x);
    y.backward(g.tensor("dy" + s));
    EXPECT_LT(max_relative_error(y, g.tensor("y" + s)), kTol);
    EXPECT_LT(max_relative_error(x.grad(), g.tensor("dx" + s)), kTol);
    EXPECT_LT(max_relative_error(bn.weight.grad(), g.tensor("dweight" + s)), kTol);
    EXPECT_LT(max_relative_error(bn.bias.grad(), g.tensor("dbias" + s)), kTol);
    EXPECT_LT(max_relative_error(bn.running_mean, g.tensor("running_mean" + s)), kTol);
    EXPECT_LT(max_relative_error(bn.running_var, g.tensor("running_var" + s)), kTol);
    EXPECT_EQ(bn.num_batches_tracked.item(), g.tensor("num_batches_tracked" + s).item());
  }
  bn.eval();
  EXPECT_LT(max_relative_error(bn.forward(g.tensor("x_eval")), g.tensor("y_eval")), kTol);
}

TEST(BatchNormTest, MatchesPyTorch) {
  BatchNorm1d bn1(3);
  check_golden(bn1, "batchnorm1d");
  BatchNorm1d bn1_3d(3, 1e-5, 0.3);
  check_golden(bn1_3d, "batchnorm1d_3d");
  BatchNorm2d bn2(4, 1e-3);
  check_golden(bn2, "batchnorm2d");
}

TEST(BatchNormTest, CudaMatchesCpu) {
  if (!dpe::cuda_available()) GTEST_SKIP() << "no CUDA device";
  manual_seed(3);
  BatchNorm2d cpu_bn(4);
  auto gpu_bn = clone_module(cpu_bn, Device::cuda(0));
  Tensor x = randn({3, 4, 5, 5}) * 2.0 + 1.0;
  Tensor y_cpu = cpu_bn.forward(x), y_gpu = gpu_bn->forward(x.to(Device::cuda(0)));
  // float32, different summation orders on the two backends: a few ulps of the per-channel sums.
  EXPECT_LT(max_relative_error(y_gpu.to(Device::cpu(0)), y_cpu, 1e-3), 1e-4);
  EXPECT_LT(max_relative_error(gpu_bn->running_var.to(Device::cpu(0)), cpu_bn.running_var), 1e-5);
  EXPECT_EQ(gpu_bn->num_batches_tracked.item(), 1.0);
  cpu_bn.eval();
  gpu_bn->eval();
  EXPECT_LT(max_relative_error(gpu_bn->forward(x.to(Device::cuda(0))).to(Device::cpu(0)), cpu_bn.forward(x), 1e-3),
            1e-4);
}

}  // namespace
}  // namespace dpe::nn
