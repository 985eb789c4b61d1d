// rotary_emb_forward_cpu / rotary_emb_backward_cpu against rotary_emb.h's formulas, each product rounded once
// and never fused with the add (float: exact products in double, rounded to float), on strided layouts: the
// permuted heads of attention, views with gaps between rows and planes (untouched), a size-1 dim with any stride,
// a row block of 64 straddled; the same bits on one and four threads.
#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/kernels/rotary_emb.h"
#include "tests/testing/kernel_test_util.h"

namespace dpe::kernels {
namespace {

template <typename T>
class RotaryEmbCpuTest : public ::testing::Test {};
TYPED_TEST_SUITE(RotaryEmbCpuTest, FloatTypes);

struct Case {
  std::string name;
  Layout strided;  // (..., T, d)
};

std::vector<Case> cases() {
  return {
      // (B, H, T, d) = (3, 2, 70, 34) viewed from (B, T, H, d) storage, as CausalSelfAttention's heads
      {"permuted heads", make_layout({3, 2, 70, 34}, {70 * 2 * 34, 34, 2 * 34, 1})},
      {"one plane of 130 rows, d = 2", contiguous({130, 2})},
      {"gaps between rows and planes", make_layout({2, 5, 8}, {100, 12, 1})},
      {"a size-1 dim with any stride", make_layout({1, 4, 6}, {999, 6, 1})},
  };
}

// The correctly rounded product, computed independently of the kernel for float.
template <typename T>
T rounded_product(T a, T b) {
  if constexpr (std::is_same_v<T, float>) {
    return static_cast<float>(static_cast<double>(a) * static_cast<double>(b));  // exact in double
  } else {
    return std::fma(a, b, 0.0);
  }
}

// Storage offset of row r (row-major over the layout's leading dims and T) and its position t.
int64_t row_offset(const Layout& l, int64_t r) {
  int64_t offset = 0;
  for (int d = l.ndim - 2; d >= 0; --d) {
    offset += r % l.sizes[d] * l.strides[d];
    r /= l.sizes[d];
  }
  return offset;
}

template <typename T>
struct Data {
  int64_t rows, T_, d;
  std::vector<T> x, cos, sin, dy;
};

template <typename T>
Data<T> data_for(const Layout& l) {
  const int64_t d = l.sizes[l.ndim - 1], T_ = l.sizes[l.ndim - 2];
  const int64_t n = l.numel();
  return {n / d, T_, d, random_vector<T>(extent(l), -3, 3, 1), random_vector<T>(T_ * d, -1, 1, 2),
          random_vector<T>(T_ * d, -1, 1, 3), random_vector<T>(n, -3, 3, 4)};
}

template <typename T>
struct Run {
  std::vector<T> y, dx;
};

template <typename T>
Run<T> run(const Layout& l, const Data<T>& in) {
  Run<T> r{std::vector<T>(l.numel(), T(-7)), std::vector<T>(in.x.size(), T(-7))};  // -7: not written
  rotary_emb_forward_cpu(dtype_of<T>(), l, in.x.data(), in.cos.data(), in.sin.data(), r.y.data());
  rotary_emb_backward_cpu(dtype_of<T>(), l, in.dy.data(), in.cos.data(), in.sin.data(), r.dx.data());
  return r;
}

TYPED_TEST(RotaryEmbCpuTest, MatchesTheFormulasOnStridedLayouts) {
  using T = TypeParam;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Data<T> in = data_for<T>(c.strided);
    const Run<T> got = run(c.strided, in);
    const int64_t d = in.d, h = d / 2;
    std::vector<bool> in_layout(in.x.size(), false);
    for (int64_t r = 0; r < in.rows; ++r) {
      const int64_t off = row_offset(c.strided, r), t = r % in.T_;
      const T* x = in.x.data() + off;
      const T* co = in.cos.data() + t * d;
      const T* si = in.sin.data() + t * d;
      const T* g = in.dy.data() + r * d;
      for (int64_t i = 0; i < d; ++i) {
        in_layout[static_cast<size_t>(off + i)] = true;
        const int64_t j = i < h ? i + h : i - h;  // the partner element
        const T xc = rounded_product(x[i], co[i]), xs = rounded_product(x[j], si[i]);
        const T gc = rounded_product(g[i], co[i]), gs = rounded_product(g[j], si[j]);
        const T y = i < h ? xc - xs : xc + xs, dx = i < h ? gc + gs : gc - gs;
        ASSERT_EQ(got.y[static_cast<size_t>(r * d + i)], y) << "y, row " << r << ", element " << i;
        ASSERT_EQ(got.dx[static_cast<size_t>(off + i)], dx) << "dx, row " << r << ", element " << i;
      }
    }
    for (size_t k = 0; k < in_layout.size(); ++k) {
      if (!in_layout[k]) {
        ASSERT_EQ(got.dx[k], T(-7)) << "dx written outside its layout at offset " << k;
      }
    }
  }
}

TYPED_TEST(RotaryEmbCpuTest, SameBitsOnOneAndFourThreads) {
  using T = TypeParam;
  const Layout l = make_layout({4, 3, 200, 32}, {200 * 3 * 32, 32, 3 * 32, 1});
  const Data<T> in = data_for<T>(l);
  Run<T> one, four;
  tbb::task_arena(1).execute([&] { one = run(l, in); });
  tbb::task_arena(4).execute([&] { four = run(l, in); });
  EXPECT_EQ(one.y, four.y);
  EXPECT_EQ(one.dx, four.dx);
}

TEST(RotaryEmbCpuErrors, NameTheLayout) {
  std::vector<float> buf(64);
  auto error = [&](const Layout& l) {
    try {
      rotary_emb_forward_cpu(DType::Float32, l, buf.data(), buf.data(), buf.data(), buf.data());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error(contiguous({4, 3})).find("last dim has size 3 and stride 1; expected an even size > 0 and stride 1"),
            std::string::npos);
  EXPECT_NE(error(make_layout({4, 2}, {1, 4})).find("last dim has size 2 and stride 4"), std::string::npos);
  EXPECT_NE(error(contiguous({8})).find("has 1 dims; expected (..., T, d)"), std::string::npos);
}

}  // namespace
}  // namespace dpe::kernels
