#include "core/tensor.h"

#include <gtest/gtest.h>

#include <limits>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops.h"
#include "tests/testing/errors.h"

namespace dpe {
namespace {

Tensor iota(const Shape& shape, DType dtype = DType::Float32) {
  return arange(shape_numel(shape), TensorOptions(dtype)).reshape(shape);
}

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }

using dpe::testing::error_of;

TEST(TensorTest, CreationAndMetadata) {
  Tensor t = Tensor::empty({2, 3, 4});
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.dtype(), DType::Float32);
  EXPECT_EQ(t.device(), Device::cpu(0));
  Tensor s = scalar_tensor(2.5);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.item(), 2.5);
  EXPECT_EQ(values(full({2}, 7.0)), (std::vector<float>{7, 7}));
  EXPECT_FALSE(Tensor().defined());
}

TEST(TensorTest, FromVectorChecksCount) {
  EXPECT_NE(error_of([] { Tensor::from_vector(std::vector<float>{1, 2, 3}, {2, 2}); }).find("3 values do not fill shape [2, 2]"),
            std::string::npos);
  EXPECT_NE(error_of([] { Tensor::empty({2, -1}); }).find("invalid shape [2, -1]"), std::string::npos);
}

// Shapes whose element or byte count does not fit in int64 are errors naming the shape; an unchecked
// product once wrapped {INT64_MAX, 2} to -2 elements, and the allocator then handed out a tiny block.
TEST(TensorTest, OverflowingShapesAreErrors) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_NE(error_of([] { Tensor::empty({kMax, 2}); }).find("shape [9223372036854775807, 2] is too large"),
            std::string::npos);
  EXPECT_NE(error_of([] { Tensor::empty({-1, 3}); }).find("invalid shape [-1, 3]: sizes must be >= 0"),
            std::string::npos);
  EXPECT_NE(error_of([] { Tensor::empty({3, std::numeric_limits<int64_t>::min()}); }).find("invalid shape"),
            std::string::npos);
  // numel fits, numel * element size does not.
  EXPECT_NE(error_of([] { Tensor::empty({kMax / 4 + 1}, DType::Float32); })
                .find("of float32 is too large: 2305843009213693952 elements of 4 bytes overflow int64"),
            std::string::npos);
  EXPECT_NE(error_of([] { Tensor::empty({kMax / 2, 3}, DType::UInt8); }).find("is too large"), std::string::npos);
  // No elements, but strides that overflow.
  EXPECT_NE(error_of([] { Tensor::empty({0, kMax, 2}); }).find("is too large"), std::string::npos);
  EXPECT_EQ(Tensor::empty({0, kMax}).numel(), 0);
  EXPECT_EQ(shape_numel({kMax, 2, 0}), 0);
  EXPECT_EQ(shape_numel({kMax}), kMax);
  EXPECT_NE(error_of([] { shape_numel({kMax, 2}); }).find("the product of its sizes overflows"), std::string::npos);
  EXPECT_NE(error_of([] { zeros({kMax, kMax}); }).find("is too large"), std::string::npos);
  EXPECT_NE(error_of([] { full({1 << 30, 1 << 30, 1 << 30}, 1.0); }).find("is too large"), std::string::npos);
  // A size that passes every check but exceeds memory: the allocator's out-of-memory error, not an abort.
  EXPECT_NE(error_of([] { Tensor::empty({int64_t{1} << 62}, DType::UInt8); }).find("out of memory on cpu:0"),
            std::string::npos);

  Tensor t = iota({2, 3});
  EXPECT_NE(error_of([&] { t.view({kMax, 2}); }).find("is invalid for"), std::string::npos);
  EXPECT_NE(error_of([&] { t.view({-1, kMax, 4}); }).find("overflows int64"), std::string::npos);
  EXPECT_NE(error_of([&] { t.reshape({kMax, kMax, 0}); }).find("is invalid for 6 elements (the product"),
            std::string::npos);
  Tensor one = iota({1, 1});
  EXPECT_NE(error_of([&] { one.expand({kMax, kMax}); }).find("the product of its sizes overflows"),
            std::string::npos);
  EXPECT_NE(error_of([&] { one.expand({1, -5}); }).find("expand: invalid size -5"), std::string::npos);
  EXPECT_EQ(one.expand({kMax, 1}).size(0), kMax);  // a broadcast view: no memory
  // narrow's start + length once overflowed past the bounds check.
  EXPECT_NE(error_of([&] { t.narrow(1, 2, kMax); }).find("narrow: range [2, 2 + 9223372036854775807) is outside"),
            std::string::npos);
  EXPECT_NE(error_of([&] { t.narrow(1, kMax, 1); }).find("is outside dimension 1 of size 3"), std::string::npos);
  EXPECT_NE(error_of([&] { t.split({kMax, kMax, 4}, 1); }).find("sum to more than an int64 holds"),
            std::string::npos);
  EXPECT_EQ(t.chunk(kMax, 1).size(), 3u);  // ceil(3 / INT64_MAX) = 1 per chunk
}

TEST(TensorTest, NarrowSelectChunkSplit) {
  Tensor t = iota({4, 3});
  EXPECT_EQ(values(t.narrow(0, 1, 2)), (std::vector<float>{3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(values(t.narrow(1, 2, 1)), (std::vector<float>{2, 5, 8, 11}));
  EXPECT_EQ(values(t.select(1, -1)), (std::vector<float>{2, 5, 8, 11}));
  EXPECT_EQ(t.narrow(0, 1, 2).storage(), t.storage());  // a view
  EXPECT_NE(error_of([&] { t.narrow(0, 3, 2); }).find("range [3, 5) is outside dimension 0 of size 4"),
            std::string::npos);

  // PyTorch's chunk rule: ceil(B/n), possibly fewer chunks than asked.
  auto sizes = [](const std::vector<Tensor>& parts) {
    std::vector<int64_t> s;
    for (const auto& p : parts) s.push_back(p.size(0));
    return s;
  };
  EXPECT_EQ(sizes(zeros({5}).chunk(3)), (std::vector<int64_t>{2, 2, 1}));
  EXPECT_EQ(sizes(zeros({4}).chunk(3)), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(sizes(zeros({9}).chunk(4)), (std::vector<int64_t>{3, 3, 3}));
  EXPECT_EQ(sizes(zeros({10}).chunk(4)), (std::vector<int64_t>{3, 3, 3, 1}));
  EXPECT_EQ(sizes(zeros({1}).chunk(8)), (std::vector<int64_t>{1}));
  EXPECT_EQ(sizes(zeros({6}).split({1, 5})), (std::vector<int64_t>{1, 5}));
  EXPECT_NE(error_of([] { zeros({6}).split({1, 4}); }).find("sizes sum to 5 but dimension 0 has size 6"),
            std::string::npos);
}

TEST(TensorTest, ViewReshapeTransposePermute) {
  Tensor t = iota({2, 3});
  EXPECT_EQ(t.view({3, 2}).shape(), (Shape{3, 2}));
  EXPECT_EQ(t.view({-1}).shape(), (Shape{6}));
  Tensor tt = t.t();
  EXPECT_FALSE(tt.is_contiguous());
  EXPECT_EQ(values(tt), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_NE(error_of([&] { tt.view({6}); }).find("without copying"), std::string::npos);
  EXPECT_EQ(values(tt.reshape({6})), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_TRUE(tt.contiguous().is_contiguous());
  Tensor p = iota({2, 3, 4}).permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.contiguous().to_vector<float>()[1], 4.0f);
  EXPECT_EQ(iota({2, 3}).unsqueeze(1).shape(), (Shape{2, 1, 3}));
  EXPECT_EQ(iota({2, 1, 3}).squeeze(1).shape(), (Shape{2, 3}));
  EXPECT_EQ(iota({2, 3, 4}).flatten(1).shape(), (Shape{2, 12}));
  EXPECT_NE(error_of([] { iota({2, 3}).view({4, -1}); }).find("invalid for 6 elements"), std::string::npos);
  EXPECT_NE(error_of([] { iota({2, 3}).transpose(0, 2); }).find("dim 2 is out of range"), std::string::npos);
}

TEST(TensorTest, ExpandBroadcastsWithStrideZero) {
  Tensor row = iota({1, 3});
  Tensor e = row.expand({2, 3});
  EXPECT_EQ(e.strides()[0], 0);
  EXPECT_EQ(values(e), (std::vector<float>{0, 1, 2, 0, 1, 2}));
  EXPECT_NE(error_of([&] { iota({2, 3}).expand({4, 3}); }).find("cannot expand [2, 3] to [4, 3]"), std::string::npos);
}

TEST(TensorTest, CopiesConvertDtypesAndStrides) {
  Tensor t = iota({2, 3});
  Tensor d = t.to(DType::Float64);
  EXPECT_EQ(d.dtype(), DType::Float64);
  EXPECT_EQ(d.to_vector<double>(), (std::vector<double>{0, 1, 2, 3, 4, 5}));
  for (DType dt : kAllDTypes) {
    EXPECT_EQ(values(t.to(dt).to(DType::Float32)), values(t)) << dt;  // small integers are exact in all dtypes
  }
  Tensor dst = zeros({3, 2});
  dst.copy_(t.t());
  EXPECT_EQ(values(dst), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  Tensor c = t.clone();
  c.fill_(1);
  EXPECT_EQ(values(t)[0], 0.0f);  // clone does not alias
  EXPECT_NE(error_of([&] { dst.copy_(zeros({2, 2})); }).find("cannot expand"), std::string::npos);
}

TEST(TensorTest, OverlappingCopyIsSafe) {
  Tensor t = iota({3, 3});
  t.copy_(t.t());
  EXPECT_EQ(values(t), (std::vector<float>{0, 3, 6, 1, 4, 7, 2, 5, 8}));
}

TEST(TensorTest, CopiesBetweenCpuDevices) {
  Tensor t = iota({4}).to(Device::cpu(1));
  EXPECT_EQ(t.device(), Device::cpu(1));
  EXPECT_EQ(values(t), (std::vector<float>{0, 1, 2, 3}));
  EXPECT_NE(error_of([] { iota({2}).to(Device::cpu(99)); }).find("cpu:99 does not exist"), std::string::npos);
  EXPECT_NE(error_of([] { iota({2}) + iota({2}).to(Device::cpu(1)); }).find("different devices (cpu:0 and cpu:1)"),
            std::string::npos);
}

TEST(TensorTest, InPlaceUpdates) {
  Tensor t = ones({3});
  t.add_(iota({3}), 2.0).mul_(0.5);
  EXPECT_EQ(values(t), (std::vector<float>{0.5f, 1.5f, 2.5f}));
  Tensor strided = zeros({2, 2}).t();
  strided.fill_(3);
  EXPECT_EQ(values(strided), (std::vector<float>{3, 3, 3, 3}));
}

TEST(TensorTest, InPlaceOnParameterNeedsNoGrad) {
  Tensor w = ones({2}).set_requires_grad(true);
  EXPECT_NE(error_of([&] { w.fill_(0); }).find("in-place writes are only allowed under NoGradGuard"), std::string::npos);
  NoGradGuard no_grad;
  w.fill_(0);
  EXPECT_EQ(values(w)[0], 0.0f);
}

TEST(TensorTest, RandomIsSeededAndCounterBased) {
  Generator a(42), b(42);
  Tensor x = rand({1000}, {}, &a);
  Tensor y = rand({1000}, {}, &b);
  EXPECT_TRUE(equal(x, y));
  EXPECT_FALSE(equal(rand({1000}, {}, &a), x));  // the counter advanced
  EXPECT_EQ(a.offset(), 2000u);
  // Filling from offset 10 gives the tail of a fill from offset 0.
  Generator c(42);
  c.set_offset(10);
  std::vector<float> tail = rand({990}, {}, &c).to_vector<float>();
  std::vector<float> all = x.to_vector<float>();
  EXPECT_EQ(tail, std::vector<float>(all.begin() + 10, all.end()));
  manual_seed(7);
  Tensor n1 = randn({100});
  manual_seed(7);
  EXPECT_TRUE(equal(randn({100}), n1));
  std::vector<float> u = x.to_vector<float>();
  for (float v : u) EXPECT_TRUE(v >= 0.0f && v < 1.0f);
}

TEST(TensorTest, ItemNeedsOneElement) {
  EXPECT_NE(error_of([] { zeros({2}).item(); }).find("expected a tensor with one element, got shape [2]"),
            std::string::npos);
}

TEST(TensorTest, StringDump) {
  std::string s = iota({2}).str();
  EXPECT_NE(s.find("shape=[2]"), std::string::npos);
  EXPECT_NE(s.find("values=[0, 1]"), std::string::npos) << s;
}

}  // namespace
}  // namespace dpe
