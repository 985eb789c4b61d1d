// max_relative_diff(a, b): max |a - b| relative to b's scale, max |b|. Float32 sums taken in another order
// (per chunk, then across devices) differ by a few ulps of the largest terms, which an elementwise ratio
// would inflate on entries that are sums of cancelling terms.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/tensor.h"

namespace dpe::testing {

inline double max_relative_diff(const Tensor& a, const Tensor& b) {
  std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  double worst = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(x[i] - y[i])));
    scale = std::max(scale, static_cast<double>(std::abs(y[i])));
  }
  return worst / (scale + 1e-12);
}

}  // namespace dpe::testing
