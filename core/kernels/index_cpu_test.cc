// CPU row gather / scatter-add kernels (core/kernels/index.h) against loops written here.
#include "core/kernels/index.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/testing/kernel_test_util.h"

namespace dpe::kernels {
namespace {

template <typename T>
class IndexCpuTest : public ::testing::Test {};
TYPED_TEST_SUITE(IndexCpuTest, FloatTypes);

TYPED_TEST(IndexCpuTest, SelectCopiesRows) {
  using T = TypeParam;
  const int64_t V = 5, D = 300;  // D spans two column tiles of index_add
  std::vector<T> table = random_vector<T>(V * D, -1, 1, 1);
  std::vector<int64_t> idx{4, 0, 4, 2};
  std::vector<T> out(idx.size() * D);
  index_select_cpu(dtype_of<T>(), V, D, table.data(), idx.size(), idx.data(), out.data());
  for (size_t i = 0; i < idx.size(); ++i) {
    for (int64_t c = 0; c < D; ++c) ASSERT_EQ(out[i * D + c], table[idx[i] * D + c]);
  }
}

TYPED_TEST(IndexCpuTest, AddAccumulatesRepeatsInOrder) {
  using T = TypeParam;
  const int64_t V = 3, D = 300, n = 2000;  // enough rows to run in parallel
  std::vector<T> src = random_vector<T>(n * D, -1, 1, 2);
  std::vector<int64_t> idx(n);
  for (int64_t i = 0; i < n; ++i) idx[i] = (i * 7) % V;
  std::vector<T> out(V * D, T(1)), expected(V * D, T(1));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < D; ++c) expected[idx[i] * D + c] += src[i * D + c];
  }
  index_add_cpu(dtype_of<T>(), V, D, n, idx.data(), src.data(), out.data());
  EXPECT_EQ(out, expected);  // same order of additions: bit-identical
}

TEST(IndexCpuErrorTest, OutOfRangeNamesIndexAndTableSizeAndWritesNothing) {
  std::vector<float> table(6, 1.0f), out(4, -1.0f);
  std::vector<int64_t> idx{1, 3};
  try {
    index_select_cpu(DType::Float32, 3, 2, table.data(), 2, idx.data(), out.data());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("index_select_cpu: index 3 at position 1 is out of range for a table of 3 rows"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(out, std::vector<float>(4, -1.0f));
  std::vector<int64_t> negative{-1};
  EXPECT_THROW(index_add_cpu(DType::Float32, 3, 2, 1, negative.data(), table.data(), out.data()), Error);
  std::vector<int64_t> ok{0};
  EXPECT_THROW(index_select_cpu(DType::Int64, 3, 2, table.data(), 1, ok.data(), out.data()), Error);
}

}  // namespace
}  // namespace dpe::kernels
