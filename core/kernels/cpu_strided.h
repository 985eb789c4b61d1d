// Walking N strided operands of the same sizes in row-major order, one run along the innermost dimension at a
// time, for the CPU kernels that take Layouts (copy_cpu.cc: src, dst; elementwise_cpu.cc's binary ops: out,
// a, b). Private to core/kernels.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/kernels/layout.h"

namespace dpe::kernels::detail {

// N operands after dropping size-1 dimensions and merging dimensions that are contiguous with respect to each
// other in all of them (stride-0 broadcast dimensions merge too), so that the innermost run is as long as
// possible. For example, a row vector broadcast over rows becomes (rows, cols) with strides (0, 1); a scalar
// becomes one dimension with stride 0; same-shape contiguous operands become one dimension. Always at least
// one dimension (a single element is size 1).
template <int N>
struct Coalesced {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};
};

// layouts: N operands with the same sizes (layouts[0]'s are read), already validated.
template <int N>
Coalesced<N> coalesce(const Layout* const (&layouts)[N]) {
  Coalesced<N> c;
  const Layout& shape = *layouts[0];
  for (int d = 0; d < shape.ndim; ++d) {
    const int64_t size = shape.sizes[d];
    if (size == 1) continue;
    const int k = c.ndim;
    bool merge = k > 0;
    for (int op = 0; op < N && merge; ++op) merge = layouts[op]->strides[d] * size == c.strides[op][k - 1];
    if (merge) {
      c.sizes[k - 1] *= size;
      for (int op = 0; op < N; ++op) c.strides[op][k - 1] = layouts[op]->strides[d];
      continue;
    }
    c.sizes[k] = size;
    for (int op = 0; op < N; ++op) c.strides[op][k] = layouts[op]->strides[d];
    ++c.ndim;
  }
  if (c.ndim == 0) {  // a single element
    c.ndim = 1;
    c.sizes[0] = 1;
  }
  return c;
}

// Calls run(offsets, len) for the runs along the innermost dimension that cover the row-major linear indices
// [begin, end), in order; offsets[op] is operand op's element offset at the start of the run, and within the
// run operand op advances by c.strides[op][c.ndim - 1].
template <int N, typename F>
void for_each_run(const Coalesced<N>& c, int64_t begin, int64_t end, const F& run) {
  const int last = c.ndim - 1;
  int64_t idx[kMaxDims];
  int64_t off[N] = {};
  int64_t rest = begin;
  for (int d = last; d >= 0; --d) {
    idx[d] = rest % c.sizes[d];
    rest /= c.sizes[d];
    for (int op = 0; op < N; ++op) off[op] += idx[d] * c.strides[op][d];
  }
  for (int64_t pos = begin; pos < end;) {
    const int64_t len = std::min(c.sizes[last] - idx[last], end - pos);
    run(static_cast<const int64_t*>(off), len);
    pos += len;
    idx[last] += len;
    for (int op = 0; op < N; ++op) off[op] += len * c.strides[op][last];
    for (int d = last; d > 0 && idx[d] == c.sizes[d]; --d) {  // carry
      idx[d] = 0;
      for (int op = 0; op < N; ++op) off[op] += c.strides[op][d - 1] - c.sizes[d] * c.strides[op][d];
      ++idx[d - 1];
    }
  }
}

}  // namespace dpe::kernels::detail
