// CPU rotary embeddings (core/kernels/rotary_emb.h): one pass over x forward and one over dy backward, where the
// composition (narrow, neg, cat, two muls and an add) made six passes forward and more backward, the muls over
// a permuted view in runs of one head's d elements; on tiny-llama its backward nodes took 8% of a step's
// backward on one core (docs/BENCHMARKS.md).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "core/kernels/arg_checks.h"
#include "core/kernels/cpu_parallel.h"
#include "core/kernels/dtype_dispatch.h"
#include "core/kernels/rotary_emb.h"

namespace dpe::kernels {
namespace {

constexpr int64_t kRowsPerTask = 64;

// Calls rows(strided, contiguous, t0, count) for blocks of `count` consecutive rows (..., t0 .. t0 + count - 1, :)
// of `strided` covering every row once: `strided` is the block's first element offset through the layout (its
// rows are strides[ndim - 2] apart) and `contiguous` the same in a contiguous tensor of the same sizes (rows d
// apart). Blocks run in parallel. One call per block, not per row: a head's row is only d elements.
template <typename F>
void for_each_row_block(const Layout& strided, const F& rows) {
  const int64_t d = strided.sizes[strided.ndim - 1], T = strided.sizes[strided.ndim - 2];
  Layout planes;  // the leading dims: one (T, d) plane per index
  planes.ndim = strided.ndim - 2;
  for (int i = 0; i < planes.ndim; ++i) {
    planes.sizes[i] = strided.sizes[i];
    planes.strides[i] = strided.strides[i];
  }
  const int64_t blocks = (T + kRowsPerTask - 1) / kRowsPerTask;
  detail::parallel_tasks(planes.numel() * blocks, kRowsPerTask * d, [&](int64_t task) {
    const int64_t plane = task / blocks, t0 = task % blocks * kRowsPerTask;
    rows(planes.offset_of(plane) + t0 * strided.strides[strided.ndim - 2], (plane * T + t0) * d, t0,
         std::min(kRowsPerTask, T - t0));
  });
}

// a * b rounded once, never contracted with the add or subtract that uses it (fma(a, b, 0) is the rounded
// product; GCC would otherwise fuse a * b + c * e into one fused multiply-add).
template <typename T>
T product(T a, T b) {
  return std::fma(a, b, T(0));
}

// One row each way (see the header's formulas); h = d / 2.
template <typename T>
void rotate_row(const T* __restrict x, const T* __restrict c, const T* __restrict s, T* __restrict y, int64_t h) {
  for (int64_t i = 0; i < h; ++i) y[i] = product(x[i], c[i]) - product(x[i + h], s[i]);
  for (int64_t i = h; i < 2 * h; ++i) y[i] = product(x[i], c[i]) + product(x[i - h], s[i]);
}

template <typename T>
void rotate_row_backward(const T* __restrict g, const T* __restrict c, const T* __restrict s, T* __restrict dx,
                         int64_t h) {
  for (int64_t i = 0; i < h; ++i) dx[i] = product(g[i], c[i]) + product(g[i + h], s[i + h]);
  for (int64_t i = h; i < 2 * h; ++i) dx[i] = product(g[i], c[i]) - product(g[i - h], s[i - h]);
}

// Both passes over every row: the forward reads x through `strided` and writes y contiguous, the backward reads
// dy contiguous and writes dx through `strided`.
template <bool kBackward>
void rotate(const char* what, DType dtype, const Layout& strided, const void* in, const void* cos, const void* sin,
            void* out) {
  detail::check_rotary_layout(what, strided);
  if (strided.numel() == 0) return;
  detail::dispatch_float(dtype, what, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t d = strided.sizes[strided.ndim - 1], h = d / 2, row_stride = strided.strides[strided.ndim - 2];
    const T* ins = static_cast<const T*>(in);
    const T* cs = static_cast<const T*>(cos);
    const T* ss = static_cast<const T*>(sin);
    T* outs = static_cast<T*>(out);
    for_each_row_block(strided, [&](int64_t first_strided, int64_t first_contiguous, int64_t t0, int64_t count) {
      for (int64_t k = 0; k < count; ++k) {
        const int64_t at = first_strided + k * row_stride, at_contiguous = first_contiguous + k * d;
        const T* c = cs + (t0 + k) * d;
        const T* s = ss + (t0 + k) * d;
        if constexpr (kBackward) {
          rotate_row_backward(ins + at_contiguous, c, s, outs + at, h);
        } else {
          rotate_row(ins + at, c, s, outs + at_contiguous, h);
        }
      }
    });
  });
}

}  // namespace

void rotary_emb_forward_cpu(DType dtype, const Layout& x_layout, const void* x, const void* cos, const void* sin,
                            void* y) {
  rotate<false>("rotary_emb_forward_cpu", dtype, x_layout, x, cos, sin, y);
}

void rotary_emb_backward_cpu(DType dtype, const Layout& dx_layout, const void* dy, const void* cos, const void* sin,
                             void* dx) {
  rotate<true>("rotary_emb_backward_cpu", dtype, dx_layout, dy, cos, sin, dx);
}

}  // namespace dpe::kernels
