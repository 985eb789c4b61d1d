// index_select / embedding ops: values, gradchecks (repeated indices, padding_idx), errors, CUDA parity.
#include "core/ops/index.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/ops.h"
#include "tests/testing/gradcheck.h"
#include "tests/testing/errors.h"

namespace dpe {
namespace {

Tensor idx(const std::vector<int64_t>& v, const Shape& s) { return Tensor::from_vector(v, s); }

using dpe::testing::error_of;

TEST(IndexOpsTest, IndexSelectValues) {
  Tensor x = Tensor::from_vector(std::vector<float>{0, 1, 2, 10, 11, 12, 20, 21, 22}, {3, 3});
  EXPECT_EQ(index_select(x, 0, idx({2, 0, 2}, {3})).to_vector<float>(),
            (std::vector<float>{20, 21, 22, 0, 1, 2, 20, 21, 22}));
  Tensor cols = index_select(x, 1, idx({1, 1}, {2}));
  EXPECT_EQ(cols.shape(), (Shape{3, 2}));
  EXPECT_EQ(cols.to_vector<float>(), (std::vector<float>{1, 1, 11, 11, 21, 21}));
  EXPECT_EQ(index_select(x, -1, idx({2}, {})).shape(), (Shape{3, 1}));  // 0-dim index keeps the dim
  EXPECT_EQ(index_select(x, 0, idx({}, {0})).shape(), (Shape{0, 3}));
}

TEST(IndexOpsTest, IndexSelectGradcheckWithRepeats) {
  Tensor x = testing::randn_leaf({4, 3, 2}, 1);
  Tensor i = idx({3, 1, 3, 3, 0}, {5});
  for (int64_t dim : {0, 1, 2}) {
    SCOPED_TRACE(dim);
    Tensor id = dim == 0 ? i : idx({1, 0, 1}, {3});
    EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return index_select(in[0], dim, id); }, {x}), "");
  }
}

TEST(IndexOpsTest, EmbeddingGradcheckRepeatsAndPadding) {
  Tensor w = testing::randn_leaf({5, 3}, 2);
  Tensor i = idx({4, 1, 1, 0, 4, 1}, {2, 3});
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return embedding(in[0], i); }, {w}), "");
  // With padding_idx the padding row's gradient is dropped on purpose (not the true derivative): check values.
  w.set_grad(Tensor());  // gradcheck leaves its last gradient behind
  Tensor y = embedding(w, i, -1);  // padding_idx -1 is row 4
  y.backward(ones_like(y));
  std::vector<double> g = w.grad().to_vector<double>();
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(g[4 * 3 + c], 0.0);  // padding row: no gradient although it was looked up twice
    EXPECT_EQ(g[1 * 3 + c], 3.0);  // three occurrences
    EXPECT_EQ(g[2 * 3 + c], 0.0);  // never looked up
  }
}

TEST(IndexOpsTest, Errors) {
  Tensor w = zeros({5, 2});
  EXPECT_NE(error_of([&] { embedding(w, idx({0, 5}, {2})); })
                .find("index 5 at position 1 is out of range for a table of 5 rows"),
            std::string::npos);
  EXPECT_NE(error_of([&] { index_select(w, 0, idx({-2}, {1})); }).find("index -2 at position 0 is out of range"),
            std::string::npos);
  EXPECT_NE(error_of([&] { embedding(w, zeros({2})); }).find("indices must be int64"), std::string::npos);
  EXPECT_NE(error_of([&] { embedding(zeros({5}), idx({0}, {1})); }).find("weight must be 2-d"), std::string::npos);
  EXPECT_NE(error_of([&] { embedding(w, idx({0}, {1}), 5); }).find("padding_idx 5 must be within num_embeddings 5"),
            std::string::npos);
  EXPECT_NE(error_of([&] { index_select(w, 0, idx({0, 1}, {1, 2})); }).find("1-d or 0-d"), std::string::npos);
  EXPECT_NE(error_of([&] { index_select(w, 0, idx({0}, {1}).to(Device::cpu(1))); }).find("indices are on cpu:1"),
            std::string::npos);
}

TEST(IndexOpsTest, CudaMatchesCpu) {
  if (!dpe::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  for (DType dtype : {DType::Float32, DType::Float64}) {
    Tensor w = randn({40, 7}, dtype).set_requires_grad(true);
    Tensor wg = w.detach().to(gpu).set_requires_grad(true);
    Tensor i = idx({3, 39, 3, 0, 17, 3, 39, 8, 8, 21}, {2, 5});
    Tensor y = embedding(w, i, 8), yg = embedding(wg, i.to(gpu), 8);
    EXPECT_TRUE(equal(yg.to(Device::cpu(0)), y));  // a gather is exact
    Tensor dy = randn(y.shape(), dtype);
    y.backward(dy);
    yg.backward(dy.to(gpu));
    // atomicAdd: the order of the (at most three) additions per element differs; a few ulps.
    EXPECT_LT(max_abs_diff(wg.grad().to(Device::cpu(0)), w.grad()), dtype == DType::Float32 ? 1e-5 : 1e-12);
    Tensor s = randn({6, 5}, dtype);
    EXPECT_TRUE(equal(index_select(s.to(gpu), 1, idx({4, 0, 4}, {3}).to(gpu)).to(Device::cpu(0)),
                      index_select(s, 1, idx({4, 0, 4}, {3}))));
  }
  EXPECT_NE(error_of([&] { embedding(zeros({5, 2}, gpu), idx({1, 2, 9, -1}, {4}).to(gpu)); })
                .find("index 9 at position 2 is out of range for a table of 5 rows"),
            std::string::npos);
}

}  // namespace
}  // namespace dpe
