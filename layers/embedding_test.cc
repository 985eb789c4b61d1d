#include "layers/embedding.h"

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

TEST(EmbeddingTest, InitIsStandardNormalWithZeroPaddingRow) {
  manual_seed(0);
  Embedding emb(200, 50, /*padding_idx=*/-1);
  EXPECT_EQ(emb.padding_idx(), 199);
  EXPECT_EQ(emb.weight.shape(), (Shape{200, 50}));
  std::vector<float> w = emb.weight.to_vector<float>();
  double sum = 0, sum_sq = 0;
  for (float v : w) {
    sum += v;
    sum_sq += double(v) * v;
  }
  const double n = static_cast<double>(w.size());
  const double mean = sum / n, var = sum_sq / n - mean * mean;
  // 10^4 N(0,1) draws (50 of them zeroed): the mean's standard error is 0.01, the variance's about 0.014.
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(var, 1.0, 0.08);
  for (int64_t c = 0; c < 50; ++c) EXPECT_EQ(w[199 * 50 + c], 0.0f);
}

TEST(EmbeddingTest, LooksUpRowsForAnyIndexShape) {
  Embedding emb(4, 2);
  {
    NoGradGuard no_grad;
    emb.weight.copy_(Tensor::from_vector(std::vector<float>{0, 1, 10, 11, 20, 21, 30, 31}, {4, 2}));
  }
  Tensor idx = Tensor::from_vector(std::vector<int64_t>{3, 0, 3, 1, 2, 2}, {2, 3});
  Tensor y = emb.forward(idx);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{30, 31, 0, 1, 30, 31, 10, 11, 20, 21, 20, 21}));
  EXPECT_EQ(emb.forward(Tensor::from_vector(std::vector<int64_t>{2}, {})).shape(), (Shape{2}));  // 0-dim index
}

TEST(EmbeddingTest, Errors) {
  Embedding emb(5, 3);
  try {
    emb.forward(Tensor::from_vector(std::vector<int64_t>{1, 7}, {2}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("index 7 at position 1 is out of range for a table of 5 rows"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(emb.forward(Tensor::from_vector(std::vector<int64_t>{-1}, {1})), Error);
  EXPECT_THROW(emb.forward(zeros({2})), Error);  // float indices
  EXPECT_THROW(Embedding(5, 3, 5), Error);       // padding_idx out of range
}

TEST(EmbeddingTest, GradcheckWithRepeatsAndPadding) {
  Tensor idx = Tensor::from_vector(std::vector<int64_t>{1, 4, 1, 5, 0, 1, 4, 2}, {2, 4});
  // Without padding the gradient is the true one: gradcheck it (repeated indices add up).
  Embedding plain(6, 3);
  plain.to(DType::Float64);
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return plain.forward(idx); }, {plain.weight}), "");
  // padding_idx deliberately drops the padding row's gradient (PyTorch), so finite differences do not
  // apply to it: check the values. The padding row gets exactly zero; row 1 the sum of its three gradients.
  Embedding emb(6, 3, /*padding_idx=*/4);
  emb.to(DType::Float64);
  Tensor y = emb.forward(idx);
  y.backward(ones_like(y));
  std::vector<double> g = emb.weight.grad().to_vector<double>();
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(g[4 * 3 + c], 0.0);
    EXPECT_EQ(g[1 * 3 + c], 3.0);
    EXPECT_EQ(g[3 * 3 + c], 0.0);
  }
}

TEST(EmbeddingTest, MatchesPyTorch) {
  testing::Golden g = testing::load_golden("embedding");  // tests/golden/gen_norm.py
  Embedding emb(10, 4, 2);
  emb.to(DType::Float64);
  {
    NoGradGuard no_grad;
    emb.weight.copy_(g.tensor("weight"));
  }
  Tensor y = emb.forward(g.tensor("indices"));
  y.backward(g.tensor("dy"));
  EXPECT_TRUE(equal(y, g.tensor("y")));  // a gather: exact
  EXPECT_LT(max_relative_error(emb.weight.grad(), g.tensor("dweight")), 1e-12);
}

TEST(EmbeddingTest, CudaMatchesCpu) {
  if (!dpe::cuda_available()) GTEST_SKIP() << "no CUDA device";
  manual_seed(1);
  Embedding emb(50, 8, 3);
  auto gpu = clone_module(emb, Device::cuda(0));
  Tensor idx = Tensor::from_vector(std::vector<int64_t>{3, 7, 7, 49, 0, 7, 3, 12}, {2, 4});
  Tensor y = emb.forward(idx), yg = gpu->forward(idx.to(Device::cuda(0)));
  EXPECT_TRUE(equal(yg.to(Device::cpu(0)), y));
  Tensor dy = randn(y.shape());
  y.backward(dy);
  yg.backward(dy.to(Device::cuda(0)));
  // atomicAdd changes the order of the (at most three) additions per element: a few ulps.
  EXPECT_LT(max_relative_error(gpu->weight.grad().to(Device::cpu(0)), emb.weight.grad(), 1e-5), 1e-5);
  EXPECT_THROW(gpu->forward(Tensor::from_vector(std::vector<int64_t>{50}, {1}).to(Device::cuda(0))), Error);
}

}  // namespace
}  // namespace dpe::nn
