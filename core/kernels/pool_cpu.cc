// CPU pooling (core/kernels/pool.h): loops over the shared per-element math of pool_math.h, one task per
// (plane, output row) or (plane, input row) under oneTBB. Each element is computed independently, so
// results do not depend on the thread count.
#include <algorithm>

#include "core/kernels/cpu_parallel.h"
#include "core/kernels/dtype_dispatch.h"
#include "core/kernels/pool.h"
#include "core/kernels/pool_math.h"

namespace dpe::kernels {
namespace {

using detail::dispatch_float;

// Calls body(plane, row) for every row of `rows` rows in each of `planes` planes; `work_per_row` elements.
template <typename F>
void for_each_row(int64_t planes, int64_t rows, int64_t work_per_row, const F& body) {
  detail::parallel_tasks(planes * rows, work_per_row, [&](int64_t t) { body(t / rows, t % rows); });
}

// Applies out[p, oi, oj] = f(in plane p, oi, oj) over (P, H_out, W_out).
template <typename T, typename F>
void map_outputs(const Pool2dShape& s, int64_t window_work, const void* x, void* y, const F& f) {
  const T* xs = static_cast<const T*>(x);
  T* ys = static_cast<T*>(y);
  for_each_row(s.planes, s.h_out, s.w_out * window_work, [&](int64_t p, int64_t oi) {
    const T* plane = xs + p * s.h * s.w;
    T* row = ys + (p * s.h_out + oi) * s.w_out;
    for (int64_t oj = 0; oj < s.w_out; ++oj) row[oj] = f(plane, p, oi, oj);
  });
}

// Applies dx[p, i, j] = f(dy plane p, p, i, j) over (P, H, W).
template <typename T, typename F>
void map_inputs(const Pool2dShape& s, int64_t window_work, const void* dy, void* dx, const F& f) {
  const T* dys = static_cast<const T*>(dy);
  T* dxs = static_cast<T*>(dx);
  for_each_row(s.planes, s.h, s.w * window_work, [&](int64_t p, int64_t i) {
    const T* plane = dys + p * s.h_out * s.w_out;
    T* row = dxs + (p * s.h + i) * s.w;
    for (int64_t j = 0; j < s.w; ++j) row[j] = f(plane, p, i, j);
  });
}

// Windows of a backward gather: about ceil(k / stride) outputs per direction.
int64_t gather_work(const Pool2dShape& s) {
  return ((s.kh + s.stride_h - 1) / s.stride_h) * ((s.kw + s.stride_w - 1) / s.stride_w);
}

// max_pool2d without padding: every window lies inside the plane, so no clipping, and one output row is
// searched a window position at a time across all its outputs. The outputs are independent, so the inner
// loop carries no dependency and vectorises; the window-by-window search (detail::max_window) chained
// each compare to the previous select and was 15% of a CNN step, this is about half of that. The same result
// as max_window: the first maximum in window order, or the first NaN (once the running maximum is NaN nothing
// replaces it).
template <typename T>
void max_pool2d_unpadded(const Pool2dShape& s, const T* xs, T* ys, int64_t* indices) {
  for_each_row(s.planes, s.h_out, s.w_out * s.kh * s.kw, [&](int64_t p, int64_t oi) {
    // Locals, not s's fields or captures: the int64 index stores could alias those, and the loops would not
    // vectorise.
    const int64_t w = s.w, w_out = s.w_out, kh = s.kh, kw = s.kw, stride_w = s.stride_w;
    const T* plane = xs + p * s.h * w;
    T* best = ys + (p * s.h_out + oi) * w_out;
    int64_t* best_index = indices + (p * s.h_out + oi) * w_out;
    const int64_t top = oi * s.stride_h * w;  // the windows' first element, for oj = 0
    for (int64_t oj = 0; oj < w_out; ++oj) {
      best[oj] = plane[top + oj * stride_w];
      best_index[oj] = top + oj * stride_w;
    }
    for (int64_t di = 0; di < kh; ++di) {
      for (int64_t dj = di == 0 ? 1 : 0; dj < kw; ++dj) {
        const int64_t offset = top + di * w + dj;
        for (int64_t oj = 0; oj < w_out; ++oj) {
          const int64_t k = offset + oj * stride_w;
          const T v = plane[k], b = best[oj];
          const bool take = (v > b) | ((v != v) & (b == b));
          best[oj] = take ? v : b;
          best_index[oj] = take ? k : best_index[oj];
        }
      }
    }
  });
}

}  // namespace

// x: (P, H, W)  y, indices: (P, H_out, W_out)
void max_pool2d_cpu(const Pool2dShape& s, const void* x, void* y, int64_t* indices) {
  check_pool2d_shape("max_pool2d_cpu", s);
  dispatch_float(s.dtype, "max_pool2d_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (s.pad_h == 0 && s.pad_w == 0) {
      max_pool2d_unpadded(s, static_cast<const T*>(x), static_cast<T*>(y), indices);
      return;
    }
    map_outputs<T>(s, s.kh * s.kw, x, y, [&](const T* plane, int64_t p, int64_t oi, int64_t oj) {
      return detail::max_window(s, plane, oi, oj, indices + (p * s.h_out + oi) * s.w_out + oj);
    });
  });
}

// dy, indices: (P, H_out, W_out)  dx: (P, H, W)
void max_pool2d_backward_cpu(const Pool2dShape& s, const void* dy, const int64_t* indices, void* dx) {
  check_pool2d_shape("max_pool2d_backward_cpu", s);
  dispatch_float(s.dtype, "max_pool2d_backward_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (s.stride_h >= s.kh && s.stride_w >= s.kw) {
      // Windows do not overlap (the usual kernel == stride): every input is the maximum of at most one
      // window, so the gradient is dy scattered through the indices, O(outputs) instead of a search per
      // input (a quarter of a CNN step). Same values as the gather below: 0 + dy == dy.
      const int64_t in_plane = s.h * s.w, out_plane = s.h_out * s.w_out;
      detail::parallel_tasks(s.planes, in_plane, [&](int64_t p) {
        T* grad = static_cast<T*>(dx) + p * in_plane;
        const T* g = static_cast<const T*>(dy) + p * out_plane;
        const int64_t* idx = indices + p * out_plane;
        std::fill(grad, grad + in_plane, T(0));
        for (int64_t o = 0; o < out_plane; ++o) grad[idx[o]] = g[o];
      });
      return;
    }
    map_inputs<T>(s, gather_work(s), dy, dx, [&](const T* plane, int64_t p, int64_t i, int64_t j) {
      return detail::max_backward_at(s, plane, indices + p * s.h_out * s.w_out, i, j);
    });
  });
}

// x: (P, H, W)  y: (P, H_out, W_out)
void avg_pool2d_cpu(const Pool2dShape& s, const void* x, void* y) {
  check_pool2d_shape("avg_pool2d_cpu", s);
  dispatch_float(s.dtype, "avg_pool2d_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    map_outputs<T>(s, s.kh * s.kw, x, y, [&](const T* plane, int64_t, int64_t oi, int64_t oj) {
      return detail::avg_window(s, plane, oi, oj);
    });
  });
}

// dy: (P, H_out, W_out)  dx: (P, H, W)
void avg_pool2d_backward_cpu(const Pool2dShape& s, const void* dy, void* dx) {
  check_pool2d_shape("avg_pool2d_backward_cpu", s);
  dispatch_float(s.dtype, "avg_pool2d_backward_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    map_inputs<T>(s, gather_work(s), dy, dx, [&](const T* plane, int64_t, int64_t i, int64_t j) {
      return detail::avg_backward_at(s, plane, i, j);
    });
  });
}

// x: (P, H, W)  y: (P, H_out, W_out)
void adaptive_avg_pool2d_cpu(const Pool2dShape& s, const void* x, void* y) {
  check_adaptive_shape("adaptive_avg_pool2d_cpu", s);
  const int64_t window_work = (s.h / s.h_out + 2) * (s.w / s.w_out + 2);
  dispatch_float(s.dtype, "adaptive_avg_pool2d_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    map_outputs<T>(s, window_work, x, y, [&](const T* plane, int64_t, int64_t oi, int64_t oj) {
      return detail::adaptive_avg_window(s, plane, oi, oj);
    });
  });
}

// dy: (P, H_out, W_out)  dx: (P, H, W)
void adaptive_avg_pool2d_backward_cpu(const Pool2dShape& s, const void* dy, void* dx) {
  check_adaptive_shape("adaptive_avg_pool2d_backward_cpu", s);
  const int64_t window_work = (s.h_out / s.h + 2) * (s.w_out / s.w + 2);
  dispatch_float(s.dtype, "adaptive_avg_pool2d_backward_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    map_inputs<T>(s, window_work, dy, dx, [&](const T* plane, int64_t, int64_t i, int64_t j) {
      return detail::adaptive_avg_backward_at(s, plane, i, j);
    });
  });
}

}  // namespace dpe::kernels
