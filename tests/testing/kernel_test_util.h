// Helpers shared by the kernel tests (core/kernels/*_test.cc): the dtype of a C++ compute type, seeded
// random inputs, Layout builders, and the (outer, size, inner) shape of the axis kernels (reduce, softmax).
// Test-only; declared in dpe::kernels so that the tests (in dpe::kernels) use them unqualified.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "core/kernels/layout.h"

namespace dpe::kernels {

// The compute types of the kernels: typed tests run once for each.
using FloatTypes = ::testing::Types<float, double>;

// DType::Float32 for float, DType::Float64 for double.
template <typename T>
constexpr DType dtype_of() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "kernels compute in float or double");
  return std::is_same_v<T, float> ? DType::Float32 : DType::Float64;
}

// n values drawn uniformly from [lo, hi) in double by an Engine seeded with `seed`, each then rounded to T:
// the same values on every run and every machine. The parity test uses std::mt19937_64, the others the
// default.
template <typename T, typename Engine = std::mt19937>
std::vector<T> random_vector(int64_t n, double lo, double hi, typename Engine::result_type seed) {
  Engine gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(static_cast<size_t>(n));
  for (T& x : v) x = static_cast<T>(dist(gen));
  return v;
}

// (outer, size, inner): the view of the reduce and softmax kernels, which work along `size`.
struct AxisShape {
  int64_t outer, size, inner;
};

// A layout with these sizes and element strides (same length, at most kMaxDims).
Layout make_layout(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides);

// The contiguous (row-major) layout of these sizes.
Layout contiguous(const std::vector<int64_t>& sizes);

// Elements of storage a layout reaches (max offset + 1), 0 when it has no elements.
int64_t extent(const Layout& l);

}  // namespace dpe::kernels
