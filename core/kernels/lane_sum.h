// A row's sum in a fixed order that vectorizes (core/kernels/*_cpu.cc only): rms_norm_cpu.cc's sums of squares
// and of products, softmax_cpu.cc's row sums (Note [Row sums in lanes] there).
#pragma once

#include <cstdint>

namespace dpe::kernels::detail {

inline constexpr int kSumLanes = 8;  // one AVX2 float vector

// The sum over i in [0, n) of term(i), accumulated in Acc: lane j adds terms j, j + 8, j + 16, ... in order, then
// the lanes are folded pairwise (j + 4 into j, then j + 2, then j + 1). One order for a given n whatever the
// thread count, and independent lanes where index order is one dependent add per element.
template <typename Acc, typename F>
Acc sum_in_lanes(int64_t n, const F& term) {
  Acc lane[kSumLanes] = {};
  int64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) {
    for (int j = 0; j < kSumLanes; ++j) lane[j] += term(i + j);
  }
  for (int j = 0; i + j < n; ++j) lane[j] += term(i + j);
  for (int width = kSumLanes / 2; width > 0; width /= 2) {
    for (int j = 0; j < width; ++j) lane[j] += lane[j + width];
  }
  return lane[0];
}

}  // namespace dpe::kernels::detail
