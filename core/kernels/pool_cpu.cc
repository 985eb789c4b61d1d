// CPU pooling (core/kernels/pool.h): loops over the shared per-element math of pool_math.h, one task per
// (plane, output row) or (plane, input row) under oneTBB; the 2x2 vector kernels take a task per plane (or per
// output row of a sample, channels last). Each element is computed independently, so results do not depend on
// the thread count.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/kernels/cpu_parallel.h"
#include "core/kernels/dtype_dispatch.h"
#include "core/kernels/pool.h"
#include "core/kernels/pool_math.h"
#include "core/kernels/pool_window.h"

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
using detail::first_lanes;
using detail::gradient_at;
using detail::load_codes;
using detail::relu_of;
using detail::store_codes;
using detail::window_max;
using detail::WindowMax;

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
// Index: int64_t (flat offsets in the plane) or uint8_t (Note [Window codes]).
template <typename Index>
void max_pool2d_2x2(const Pool2dShape& s, const float* xs, float* ys, Index* indices) {
  // One task per plane (like the backward's): a task per output row cost two int64 divisions a row.
  detail::parallel_tasks(s.planes, s.h * s.w, [&](int64_t p) {
    for (int64_t oi = 0; oi < s.h_out; ++oi) {
      const int64_t w = s.w, w_out = s.w_out;
      const int64_t top = 2 * oi * w;  // the windows' first row, as a flat index into the plane
      const float* r0 = xs + p * s.h * w + top;
      const float* r1 = r0 + w;
      float* y = ys + (p * s.h_out + oi) * w_out;
      Index* index = indices + (p * s.h_out + oi) * w_out;
      const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      const __m256i one = _mm256_set1_epi32(1);
      for (int64_t j = 0; j < w_out; j += 8) {
        // Lanes [0, n) are outputs j..j+n of this row; their inputs are the 2n floats from 2j in each row.
        const int32_t n = static_cast<int32_t>(std::min<int64_t>(8, w_out - j));
        const __m256i out_mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane);
        const __m256i in_lo = _mm256_cmpgt_epi32(_mm256_set1_epi32(2 * n), lane);
        const __m256i in_hi = _mm256_cmpgt_epi32(_mm256_set1_epi32(2 * n - 8), lane);
        __m256 a, b, c, d;
        load_pairs(r0 + 2 * j, in_lo, in_hi, a, b);
        load_pairs(r1 + 2 * j, in_lo, in_hi, c, d);
        WindowMax m = window_max(a, b, c, d);
        if constexpr (std::is_same_v<Index, uint8_t>) {
          if (s.relu) m = relu_of(m);
        }
        _mm256_maskstore_ps(y + j, out_mask, m.value);
        if constexpr (std::is_same_v<Index, uint8_t>) {
          store_codes(index + j, m.code, n);
        } else {
          // The winner's offset from the row's first window: 2 * lane, + w in the bottom row, + 1 on the right.
          const __m256i bottom = _mm256_cmpgt_epi32(m.code, one);
          const __m256i offset = _mm256_add_epi32(
              _mm256_add_epi32(_mm256_slli_epi32(lane, 1), _mm256_and_si256(m.code, one)),
              _mm256_and_si256(bottom, _mm256_set1_epi32(static_cast<int32_t>(w))));
          const __m256i first = _mm256_set1_epi64x(top + 2 * j);
          const __m256i index_lo = _mm256_add_epi64(first, _mm256_cvtepi32_epi64(_mm256_castsi256_si128(offset)));
          const __m256i index_hi = _mm256_add_epi64(first, _mm256_cvtepi32_epi64(_mm256_extracti128_si256(offset, 1)));
          auto* out = reinterpret_cast<long long*>(index + j);
          _mm256_maskstore_epi64(out, _mm256_cvtepi32_epi64(_mm256_castsi256_si128(out_mask)), index_lo);
          _mm256_maskstore_epi64(out + 4, _mm256_cvtepi32_epi64(_mm256_extracti128_si256(out_mask, 1)), index_hi);
        }
      }
    }
  });
}

// (v0[0] v1[0] v0[1] v1[1] ... v0[7] v1[7]) as two vectors: a gradient row of eight windows' left and right
// columns.
void interleave(__m256 v0, __m256 v1, __m256& first, __m256& second) {
  const __m256 lo = _mm256_unpacklo_ps(v0, v1), hi = _mm256_unpackhi_ps(v0, v1);  // per 128-bit half
  first = _mm256_permute2f128_ps(lo, hi, 0x20);
  second = _mm256_permute2f128_ps(lo, hi, 0x31);
}

// The gradient rows r0 (the windows' top) and r1 of eight windows from their dy and codes (lanes as int32).
// Full: 16 floats a row; else lanes [0, n) through the masks.
template <bool kFull>
void write_window_gradients(__m256 dy, __m256i code, float* r0, float* r1, __m256i mask_lo, __m256i mask_hi) {
  __m256 top_first, top_second, bottom_first, bottom_second;
  interleave(gradient_at(dy, code, 0), gradient_at(dy, code, 1), top_first, top_second);
  interleave(gradient_at(dy, code, 2), gradient_at(dy, code, 3), bottom_first, bottom_second);
  if constexpr (kFull) {
    _mm256_storeu_ps(r0, top_first);
    _mm256_storeu_ps(r0 + 8, top_second);
    _mm256_storeu_ps(r1, bottom_first);
    _mm256_storeu_ps(r1 + 8, bottom_second);
  } else {
    _mm256_maskstore_ps(r0, mask_lo, top_first);
    _mm256_maskstore_ps(r0 + 8, mask_hi, top_second);
    _mm256_maskstore_ps(r1, mask_lo, bottom_first);
    _mm256_maskstore_ps(r1 + 8, mask_hi, bottom_second);
  }
}

// The backward of Note [Window codes]: each output row's two gradient rows written once, eight windows at a
// time. The column and row no window covers (odd W, odd H) are zeroed.
void max_pool2d_2x2_backward(const Pool2dShape& s, const float* dys, const uint8_t* codes, float* dxs) {
  // One task per plane: a task per output row cost two int64 divisions per row, more than the row's work on
  // the CNN's 7-wide rows.
  detail::parallel_tasks(s.planes, s.h * s.w, [&](int64_t p) {
    const int64_t w = s.w, w_out = s.w_out, tail = w_out % 8;
    const __m256i out_mask = first_lanes(tail), mask_lo = first_lanes(2 * tail), mask_hi = first_lanes(2 * tail - 8);
    for (int64_t oi = 0; oi < s.h_out; ++oi) {
      const float* g = dys + (p * s.h_out + oi) * w_out;
      const uint8_t* code = codes + (p * s.h_out + oi) * w_out;
      float* r0 = dxs + p * s.h * w + 2 * oi * w;
      float* r1 = r0 + w;
      int64_t j = 0;
      for (; j + 8 <= w_out; j += 8) {
        write_window_gradients<true>(_mm256_loadu_ps(g + j), load_codes(code + j, 8), r0 + 2 * j, r1 + 2 * j,
                                     mask_lo, mask_hi);
      }
      if (tail > 0) {
        write_window_gradients<false>(_mm256_maskload_ps(g + j, out_mask), load_codes(code + j, tail), r0 + 2 * j,
                                      r1 + 2 * j, mask_lo, mask_hi);
      }
      if (w % 2 != 0) r0[w - 1] = r1[w - 1] = 0.0f;
    }
    if (s.h % 2 != 0) std::fill(dxs + (p + 1) * s.h * w - w, dxs + (p + 1) * s.h * w, 0.0f);
  });
}

// Channels last (Note [Memory formats]): a window's four candidates are rows of C channels at (2oi, 2oj),
// (2oi, 2oj + 1), (2oi + 1, 2oj), (2oi + 1, 2oj + 1); eight channels at a time, the same tree as the NCHW
// kernel. One task per output row of a sample (w_out * C outputs).
void max_pool2d_2x2_channels_last(const Pool2dShape& s, const float* xs, float* ys, uint8_t* codes) {
  const int64_t c = s.c, batch = s.planes / s.c;
  detail::parallel_tasks(batch * s.h_out, s.w_out * c * 4, [&](int64_t t) {
    const int64_t n = t / s.h_out, oi = t % s.h_out, tail = c % 8;
    const __m256i mask = first_lanes(tail);
    const float* r0 = xs + (n * s.h + 2 * oi) * s.w * c;
    const float* r1 = r0 + s.w * c;
    float* y = ys + t * s.w_out * c;
    uint8_t* code = codes + t * s.w_out * c;
    for (int64_t oj = 0; oj < s.w_out; ++oj, y += c, code += c) {
      const float *a = r0 + 2 * oj * c, *b = a + c, *d0 = r1 + 2 * oj * c, *d1 = d0 + c;
      int64_t k = 0;
      for (; k + 8 <= c; k += 8) {
        WindowMax m = window_max(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), _mm256_loadu_ps(d0 + k),
                                 _mm256_loadu_ps(d1 + k));
        if (s.relu) m = relu_of(m);
        _mm256_storeu_ps(y + k, m.value);
        store_codes(code + k, m.code, 8);
      }
      if (tail > 0) {
        WindowMax m = window_max(_mm256_maskload_ps(a + k, mask), _mm256_maskload_ps(b + k, mask),
                                 _mm256_maskload_ps(d0 + k, mask), _mm256_maskload_ps(d1 + k, mask));
        if (s.relu) m = relu_of(m);
        _mm256_maskstore_ps(y + k, mask, m.value);
        store_codes(code + k, m.code, static_cast<int32_t>(tail));
      }
    }
  });
}

// The channels-last backward: each window's four rows of C gradients written once; the column and row no window
// covers (odd W, odd H) zeroed.
void max_pool2d_2x2_channels_last_backward(const Pool2dShape& s, const float* dys, const uint8_t* codes,
                                           float* dxs) {
  const int64_t c = s.c, batch = s.planes / s.c;
  detail::parallel_tasks(batch * s.h_out, s.w_out * c * 4, [&](int64_t t) {
    const int64_t n = t / s.h_out, oi = t % s.h_out, tail = c % 8, row = s.w * c;
    const __m256i mask = first_lanes(tail);
    float* r0 = dxs + (n * s.h + 2 * oi) * row;
    float* r1 = r0 + row;
    const float* g = dys + t * s.w_out * c;
    const uint8_t* code = codes + t * s.w_out * c;
    for (int64_t oj = 0; oj < s.w_out; ++oj, g += c, code += c) {
      float *a = r0 + 2 * oj * c, *b = a + c, *d0 = r1 + 2 * oj * c, *d1 = d0 + c;
      int64_t k = 0;
      for (; k + 8 <= c; k += 8) {
        const __m256 dy = _mm256_loadu_ps(g + k);
        const __m256i place = load_codes(code + k, 8);
        _mm256_storeu_ps(a + k, gradient_at(dy, place, 0));
        _mm256_storeu_ps(b + k, gradient_at(dy, place, 1));
        _mm256_storeu_ps(d0 + k, gradient_at(dy, place, 2));
        _mm256_storeu_ps(d1 + k, gradient_at(dy, place, 3));
      }
      if (tail > 0) {
        const __m256 dy = _mm256_maskload_ps(g + k, mask);
        const __m256i place = load_codes(code + k, tail);
        _mm256_maskstore_ps(a + k, mask, gradient_at(dy, place, 0));
        _mm256_maskstore_ps(b + k, mask, gradient_at(dy, place, 1));
        _mm256_maskstore_ps(d0 + k, mask, gradient_at(dy, place, 2));
        _mm256_maskstore_ps(d1 + k, mask, gradient_at(dy, place, 3));
      }
    }
    if (s.w % 2 != 0) {
      std::fill(r0 + row - c, r0 + row, 0.0f);
      std::fill(r1 + row - c, r1 + row, 0.0f);
    }
    if (oi == s.h_out - 1 && s.h % 2 != 0) std::fill(r1 + row, r1 + 2 * row, 0.0f);
  });
}
#endif

}  // namespace

// x: (P, H, W)  y, indices: (P, H_out, W_out)
void max_pool2d_cpu(const Pool2dShape& s, const void* x, void* y, int64_t* indices) {
  check_pool2d_shape("max_pool2d_cpu", s);
  DPE_INTERNAL_ASSERT(!s.channels_last && !s.relu, "max_pool2d_cpu takes NCHW, without relu, only");
  dispatch_float(s.dtype, "max_pool2d_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
#if defined(__AVX2__)
    if (max_pool2d_2x2_applies(s)) {
      max_pool2d_2x2<int64_t>(s, static_cast<const float*>(x), static_cast<float*>(y), indices);
      return;
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

bool max_pool2d_2x2_applies(const Pool2dShape& s) {
#if defined(__AVX2__)
  // Offsets within a plane are int32 in the vector kernels.
  return s.dtype == DType::Float32 && s.pad_h == 0 && s.pad_w == 0 && s.kh == 2 && s.kw == 2 && s.stride_h == 2 &&
         s.stride_w == 2 && s.w < (int64_t{1} << 30) && (!s.channels_last || (s.c > 0 && s.planes % s.c == 0));
#else
  (void)s;
  return false;
#endif
}

// x: (P, H, W)  y, codes: (P, H_out, W_out)
void max_pool2d_2x2_cpu(const Pool2dShape& s, const void* x, void* y, uint8_t* codes) {
  check_pool2d_shape("max_pool2d_2x2_cpu", s);
  DPE_INTERNAL_ASSERT(max_pool2d_2x2_applies(s), "the 2x2 window-code kernels do not take this pool");
#if defined(__AVX2__)
  if (s.channels_last) {
    max_pool2d_2x2_channels_last(s, static_cast<const float*>(x), static_cast<float*>(y), codes);
  } else {
    max_pool2d_2x2<uint8_t>(s, static_cast<const float*>(x), static_cast<float*>(y), codes);
  }
#endif
}

// dy, codes: (P, H_out, W_out)  dx: (P, H, W)
void max_pool2d_2x2_backward_cpu(const Pool2dShape& s, const void* dy, const uint8_t* codes, void* dx) {
  check_pool2d_shape("max_pool2d_2x2_backward_cpu", s);
  DPE_INTERNAL_ASSERT(max_pool2d_2x2_applies(s), "the 2x2 window-code kernels do not take this pool");
#if defined(__AVX2__)
  if (s.channels_last) {
    max_pool2d_2x2_channels_last_backward(s, static_cast<const float*>(dy), codes, static_cast<float*>(dx));
  } else {
    max_pool2d_2x2_backward(s, static_cast<const float*>(dy), codes, static_cast<float*>(dx));
  }
#endif
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
