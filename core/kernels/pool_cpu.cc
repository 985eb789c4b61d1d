// CPU pooling (core/kernels/pool.h): loops over the shared per-element math of pool_math.h, one task per
// (plane, output row) or (plane, input row) under oneTBB. Each element is computed independently, so
// results do not depend on the thread count.
#include <algorithm>
#include <type_traits>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

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

#if defined(__AVX2__)
// Lanes where `second` beats `first` under max_window's rule: larger, or a NaN where `first` is not one (the
// first NaN wins).
__m256 second_wins(__m256 first, __m256 second) {
  const __m256 larger = _mm256_cmp_ps(second, first, _CMP_GT_OQ);
  const __m256 nan_over_number =
      _mm256_and_ps(_mm256_cmp_ps(second, second, _CMP_UNORD_Q), _mm256_cmp_ps(first, first, _CMP_ORD_Q));
  return _mm256_or_ps(larger, nan_over_number);
}

// The even and the odd elements of the 16 floats at p whose lanes are set in mask_lo (p[0..8)) and mask_hi
// (p[8..16)); masked-out lanes are not read.
void load_pairs(const float* p, __m256i mask_lo, __m256i mask_hi, __m256& even, __m256& odd) {
  const __m256 lo = _mm256_maskload_ps(p, mask_lo), hi = _mm256_maskload_ps(p + 8, mask_hi);
  // shuffle_ps works within 128-bit halves: (lo0 lo2 hi0 hi2 | lo4 lo6 hi4 hi6); the 64-bit permute puts the
  // pairs in order.
  even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0x88)), 0xd8));
  odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0xdd)), 0xd8));
}

// Note [2x2 max-pool]
// MaxPool2d(2) (kernel 2, stride 2, no padding: the CNN's pools and most others) on float32, eight outputs
// at a time: each window row's first maximum, then the bottom row's only where it beats the top row's (a
// NaN counting as larger, the first NaN winning). Every candidate of the top row precedes every candidate of
// the bottom row in window order, so this is max_window's result, index and NaN rule included. A row's last
// outputs (all of a 7-wide row) use masked loads and stores. On the CNN's 14- and 7-wide output rows the
// unpadded search's strided sweeps ran at 3-6 GB/s, this at 15-17 (bench/cnn_kernels_bench, one core); a
// scalar version of the tree compiled to branches that random data mispredicts, and was slower still.
void max_pool2d_2x2(const Pool2dShape& s, const float* xs, float* ys, int64_t* indices) {
  for_each_row(s.planes, s.h_out, s.w_out * 4, [&](int64_t p, int64_t oi) {
    const int64_t w = s.w, w_out = s.w_out;
    const int64_t top = 2 * oi * w;  // the windows' first row, as a flat index into the plane
    const float* r0 = xs + p * s.h * w + top;
    const float* r1 = r0 + w;
    float* y = ys + (p * s.h_out + oi) * w_out;
    int64_t* index = indices + (p * s.h_out + oi) * w_out;
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i one = _mm256_set1_epi32(1), row = _mm256_set1_epi32(static_cast<int32_t>(w));
    for (int64_t j = 0; j < w_out; j += 8) {
      // Lanes [0, n) are outputs j..j+n of this row; their inputs are the 2n floats from 2j in each row.
      const int32_t n = static_cast<int32_t>(std::min<int64_t>(8, w_out - j));
      const __m256i out_mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane);
      const __m256i in_lo = _mm256_cmpgt_epi32(_mm256_set1_epi32(2 * n), lane);
      const __m256i in_hi = _mm256_cmpgt_epi32(_mm256_set1_epi32(2 * n - 8), lane);
      __m256 a, b, c, d;
      load_pairs(r0 + 2 * j, in_lo, in_hi, a, b);
      load_pairs(r1 + 2 * j, in_lo, in_hi, c, d);
      const __m256 top_right = second_wins(a, b), bottom_right = second_wins(c, d);
      const __m256 upper = _mm256_blendv_ps(a, b, top_right), lower = _mm256_blendv_ps(c, d, bottom_right);
      const __m256 bottom = second_wins(upper, lower);
      _mm256_maskstore_ps(y + j, out_mask, _mm256_blendv_ps(upper, lower, bottom));
      // The winner's offset from the window's first element: 0 or 1 in the top row, w or w + 1 below.
      const __m256i upper_offset = _mm256_and_si256(_mm256_castps_si256(top_right), one);
      const __m256i lower_offset = _mm256_add_epi32(row, _mm256_and_si256(_mm256_castps_si256(bottom_right), one));
      const __m256i offset = _mm256_add_epi32(
          _mm256_slli_epi32(lane, 1),
          _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(upper_offset), _mm256_castsi256_ps(lower_offset),
                                               bottom)));
      const __m256i first = _mm256_set1_epi64x(top + 2 * j);
      const __m256i index_lo = _mm256_add_epi64(first, _mm256_cvtepi32_epi64(_mm256_castsi256_si128(offset)));
      const __m256i index_hi = _mm256_add_epi64(first, _mm256_cvtepi32_epi64(_mm256_extracti128_si256(offset, 1)));
      auto* out = reinterpret_cast<long long*>(index + j);
      _mm256_maskstore_epi64(out, _mm256_cvtepi32_epi64(_mm256_castsi256_si128(out_mask)), index_lo);
      _mm256_maskstore_epi64(out + 4, _mm256_cvtepi32_epi64(_mm256_extracti128_si256(out_mask, 1)), index_hi);
    }
  });
}
#endif

}  // namespace

// x: (P, H, W)  y, indices: (P, H_out, W_out)
void max_pool2d_cpu(const Pool2dShape& s, const void* x, void* y, int64_t* indices) {
  check_pool2d_shape("max_pool2d_cpu", s);
  dispatch_float(s.dtype, "max_pool2d_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
#if defined(__AVX2__)
    // Offsets within a plane are int32 in the vector kernel.
    if constexpr (std::is_same_v<T, float>) {
      if (s.pad_h == 0 && s.pad_w == 0 && s.kh == 2 && s.kw == 2 && s.stride_h == 2 && s.stride_w == 2 &&
          s.w < (int64_t{1} << 30)) {
        max_pool2d_2x2(s, static_cast<const float*>(x), static_cast<float*>(y), indices);
        return;
      }
    }
#endif
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
