// CPU softmax / log-softmax over the middle axis of (outer, size, inner), and their backward.
//
// Numerics: the row maximum is subtracted before exp, so no exp overflows; sums along the axis (sum of exp,
// sum of dy * y, sum of dy) accumulate in double for both dtypes, in a fixed order (Note [Row sums in lanes]),
// so results do not depend on threads. A NaN in a row makes the whole row NaN; a row of all -inf gives NaN (as
// PyTorch does).
// Aliasing: y may be x, and dx may be y or dy (each element is read before it is written).
// Thread-safety: independent rows / column tiles run under tbb::parallel_for in the caller's task_arena.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/error.h"
#include "core/kernels/arg_checks.h"
#include "core/kernels/cpu_parallel.h"
#include "core/kernels/dtype_dispatch.h"
#include "core/kernels/lane_sum.h"
#include "core/kernels/softmax.h"
#include "core/kernels/vector_exp.h"

namespace dpe::kernels {
namespace {

using detail::parallel_column_tiles;
using detail::check_softmax_args;
using detail::dispatch_float;

constexpr int64_t kTile = 256;  // columns of `inner` processed together

// Splits (outer, size, inner) into tasks: one per row when inner == 1, else one per (outer, column tile);
// calls body(offset of the task's first element, columns w) with rows `size` apart by `inner`.
template <typename F>
void for_each_slice(int64_t outer, int64_t size, int64_t inner, const F& body) {
  parallel_column_tiles(outer, size, inner, kTile,
                        [&](int64_t o, int64_t c0, int64_t w) { body(o * size * inner + c0, w); });
}

// Rows shorter than this keep the scalar exp: a padded group of 8 gains nothing on the MLP's and CNN's 10
// classes, and their training runs keep the bits of their documented curves (with libmvec's exp there, the
// MLP's 10-epoch DDP accuracy moved from 0.8861 to 0.8843: the same noise, on the wrong side of a floor).
constexpr int64_t kVectorExpMinRow = 32;

// Note [Row sums in lanes]
// A contiguous row's sums added one by one in index order are one dependent double add per element: with the max
// and the divide, tiny-llama's attention softmax (16,384 rows of 64) took 3.3 ms and its log-softmax over the
// vocabulary (4,096 rows of 259) 3.6 ms, a third of its forward on one core. Rows of kVectorExpMinRow or more (the
// rows whose exps go eight at a time) take their maximum and sums in kSumLanes interleaved lanes instead, folded
// pairwise at the end (detail::sum_in_lanes, core/kernels/lane_sum.h; log-softmax's exps per chunk of 256, the
// chunks' sums added in order): still one fixed order for a given length, whatever the threads, and it vectorizes:
// 4-5x faster forward, 1.5-2.5x backward on those shapes (docs/BENCHMARKS.md). The maximum is exact in any order
// (a NaN, whichever lane keeps it, makes its exp and so the row NaN). Shorter rows keep index order, so the MLP's
// and CNN's 10 classes keep their bits.
using detail::kSumLanes;

template <typename T>
T row_max(const T* x, int64_t n) {
  T m = x[0];
  if (n < kVectorExpMinRow) {
    for (int64_t i = 1; i < n; ++i) m = x[i] > m ? x[i] : m;
    return m;
  }
  T lane[kSumLanes];
  for (int j = 0; j < kSumLanes; ++j) lane[j] = m;
  int64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) {
    for (int j = 0; j < kSumLanes; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
  }
  for (int j = 0; i + j < n; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
  for (int j = 1; j < kSumLanes; ++j) m = lane[j] > m ? lane[j] : m;
  return m;
}

// The sum over i in [0, n) of term(i) (a double), in Note [Row sums in lanes]'s order.
template <typename F>
double row_sum(int64_t n, const F& term) {
  if (n >= kVectorExpMinRow) return detail::sum_in_lanes<double>(n, term);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += term(i);
  return sum;
}

// e[i] = exp(x[i] - m) for i in [0, n): eight at a time where `vector` (float rows of kVectorExpMinRow or more,
// Note [Eight exps at once]), else std::exp. e may be x.
template <typename T>
void exp_shifted(const T* x, T m, T* e, int64_t n, bool vector) {
#if defined(__AVX2__)
  if constexpr (std::is_same_v<T, float>) {
    if (vector) {
      const __m256 mv = _mm256_set1_ps(m);
      detail::map8(x, nullptr, e, 0, n, [&](__m256 v, __m256) { return detail::exp8(_mm256_sub_ps(v, mv)); });
      return;
    }
  }
#endif
  for (int64_t i = 0; i < n; ++i) e[i] = std::exp(x[i] - m);
}

// A row's log-softmax is (x[i] - m) - log_total: its maximum and the log of the sum of exp(x[i] - m). The exps go
// through a small buffer, each chunk summed by row_sum and the chunks' sums added in order.
template <typename T>
struct LogSoftmaxStats {
  T m, log_total;
};

template <typename T>
LogSoftmaxStats<T> log_softmax_stats(int64_t size, const T* x) {
  const bool vector = std::is_same_v<T, float> && size >= kVectorExpMinRow;
  const T m = row_max(x, size);
  constexpr int64_t kChunk = 256;
  alignas(32) T e[kChunk];
  double sum = 0;
  for (int64_t c = 0; c < size; c += kChunk) {
    const int64_t len = std::min(kChunk, size - c);
    exp_shifted(x + c, m, e, len, vector);
    sum += row_sum(len, [&](int64_t i) { return static_cast<double>(e[i]); });
  }
  return {m, static_cast<T>(std::log(sum))};
}

// x, y: (size) contiguous.
template <typename T>
void softmax_row(SoftmaxKind kind, int64_t size, const T* x, T* y) {
  if (kind == SoftmaxKind::Softmax) {
    const bool vector = std::is_same_v<T, float> && size >= kVectorExpMinRow;
    const T m = row_max(x, size);
    exp_shifted(x, m, y, size, vector);
    const T total = static_cast<T>(row_sum(size, [&](int64_t i) { return static_cast<double>(y[i]); }));
    for (int64_t i = 0; i < size; ++i) y[i] /= total;
  } else {
    const LogSoftmaxStats<T> st = log_softmax_stats(size, x);  // y may be x, which the last pass reads
    for (int64_t i = 0; i < size; ++i) y[i] = (x[i] - st.m) - st.log_total;
  }
}

// x, y: (size, w) with row stride `inner`, w <= kTile.
template <typename T>
void softmax_columns(SoftmaxKind kind, int64_t size, int64_t inner, int64_t w, const T* x, T* y) {
  T m[kTile];
  double sum[kTile];
  for (int64_t j = 0; j < w; ++j) {
    m[j] = x[j];
    sum[j] = 0;
  }
  for (int64_t s = 1; s < size; ++s) {
    const T* row = x + s * inner;
    for (int64_t j = 0; j < w; ++j) m[j] = row[j] > m[j] ? row[j] : m[j];
  }
  if (kind == SoftmaxKind::Softmax) {
    for (int64_t s = 0; s < size; ++s) {
      const T* row = x + s * inner;
      T* out = y + s * inner;
      for (int64_t j = 0; j < w; ++j) {
        const T e = std::exp(row[j] - m[j]);
        out[j] = e;
        sum[j] += e;
      }
    }
    T total[kTile];
    for (int64_t j = 0; j < w; ++j) total[j] = static_cast<T>(sum[j]);
    for (int64_t s = 0; s < size; ++s) {
      T* out = y + s * inner;
      for (int64_t j = 0; j < w; ++j) out[j] /= total[j];
    }
  } else {
    for (int64_t s = 0; s < size; ++s) {
      const T* row = x + s * inner;
      for (int64_t j = 0; j < w; ++j) sum[j] += std::exp(row[j] - m[j]);
    }
    T log_total[kTile];
    for (int64_t j = 0; j < w; ++j) log_total[j] = static_cast<T>(std::log(sum[j]));
    for (int64_t s = 0; s < size; ++s) {
      const T* row = x + s * inner;
      T* out = y + s * inner;
      for (int64_t j = 0; j < w; ++j) out[j] = (row[j] - m[j]) - log_total[j];
    }
  }
}

// y, dy, dx: (size, w) with row stride `inner`, w <= kTile.
//   softmax:     dx = y * (dy - sum(dy * y))
//   log_softmax: dx = dy - exp(y) * sum(dy)
template <typename T>
void softmax_backward_columns(SoftmaxKind kind, int64_t size, int64_t inner, int64_t w, const T* y, const T* dy,
                              T* dx) {
  double sum[kTile];
  for (int64_t j = 0; j < w; ++j) sum[j] = 0;
  for (int64_t s = 0; s < size; ++s) {
    const T* yr = y + s * inner;
    const T* dyr = dy + s * inner;
    if (kind == SoftmaxKind::Softmax) {
      for (int64_t j = 0; j < w; ++j) sum[j] += static_cast<double>(dyr[j]) * static_cast<double>(yr[j]);
    } else {
      for (int64_t j = 0; j < w; ++j) sum[j] += dyr[j];
    }
  }
  T total[kTile];
  for (int64_t j = 0; j < w; ++j) total[j] = static_cast<T>(sum[j]);
  for (int64_t s = 0; s < size; ++s) {
    const T* yr = y + s * inner;
    const T* dyr = dy + s * inner;
    T* dxr = dx + s * inner;
    if (kind == SoftmaxKind::Softmax) {
      for (int64_t j = 0; j < w; ++j) dxr[j] = yr[j] * (dyr[j] - total[j]);
    } else {
      for (int64_t j = 0; j < w; ++j) dxr[j] = dyr[j] - std::exp(yr[j]) * total[j];
    }
  }
}

// A contiguous row's sums, without the kTile-wide scratch arrays.
template <typename T>
void softmax_backward_row(SoftmaxKind kind, int64_t size, const T* y, const T* dy, T* dx) {
  if (kind == SoftmaxKind::Softmax) {
    const T total = static_cast<T>(
        row_sum(size, [&](int64_t i) { return static_cast<double>(dy[i]) * static_cast<double>(y[i]); }));
    for (int64_t i = 0; i < size; ++i) dx[i] = y[i] * (dy[i] - total);
  } else {
    const T total = static_cast<T>(row_sum(size, [&](int64_t i) { return static_cast<double>(dy[i]); }));
#if defined(__AVX2__)
    if constexpr (std::is_same_v<T, float>) {
      if (size >= kVectorExpMinRow) {  // Note [Eight exps at once]
        const __m256 t = _mm256_set1_ps(total);
        detail::map8(y, dy, dx, 0, size, [&](__m256 yv, __m256 dyv) {
          return _mm256_sub_ps(dyv, _mm256_mul_ps(detail::exp8(yv), t));
        });
        return;
      }
    }
#endif
    for (int64_t i = 0; i < size; ++i) dx[i] = dy[i] - std::exp(y[i]) * total;
  }
}

// log_softmax's backward, dx = dy - exp(y) * sum(dy), of the nll's gradient dy (dyt at class t, 0 elsewhere; t < 0:
// all 0), with y recomputed from x and the row's stats: softmax_backward_row's arithmetic, element for element.
template <typename T>
void cross_entropy_row_backward(int64_t size, const T* x, LogSoftmaxStats<T> st, int64_t t, T dyt, T* dx) {
  auto dy = [&](int64_t i) { return i == t ? dyt : T(0); };
  const T total = static_cast<T>(row_sum(size, [&](int64_t i) { return static_cast<double>(dy(i)); }));
#if defined(__AVX2__)
  if constexpr (std::is_same_v<T, float>) {
    if (size >= kVectorExpMinRow) {  // Note [Eight exps at once]
      const __m256 mv = _mm256_set1_ps(st.m), lv = _mm256_set1_ps(st.log_total), tv = _mm256_set1_ps(total);
      auto dx8 = [&](__m256 xv, __m256 dyv) {
        const __m256 yv = _mm256_sub_ps(_mm256_sub_ps(xv, mv), lv);
        return _mm256_sub_ps(dyv, _mm256_mul_ps(detail::exp8(yv), tv));
      };
      detail::map8(x, nullptr, dx, 0, size, dx8);  // dy = 0 in every lane
      if (t >= 0) {  // the target's lane again, with its dy
        alignas(32) float lane[8];
        _mm256_store_ps(lane, dx8(_mm256_set1_ps(x[t]), _mm256_set1_ps(dyt)));
        dx[t] = lane[0];
      }
      return;
    }
  }
#endif
  for (int64_t i = 0; i < size; ++i) {
    const T y = (x[i] - st.m) - st.log_total;
    dx[i] = dy(i) - std::exp(y) * total;
  }
}

}  // namespace

void cross_entropy_rows_cpu(DType dtype, int64_t rows, int64_t size, const void* x, const int64_t* target,
                            int64_t ignore_index, void* loss, void* valid, void* stats) {
  check_softmax_args("cross_entropy_rows_cpu", SoftmaxKind::LogSoftmax, rows, size, 1);
  if (rows == 0 || size == 0) return;
  dispatch_float(dtype, "cross_entropy_rows_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xs = static_cast<const T*>(x);
    T *out = static_cast<T*>(loss), *mask = static_cast<T*>(valid), *st = static_cast<T*>(stats);
    for_each_slice(rows, size, 1, [&](int64_t offset, int64_t) {
      const int64_t n = offset / size, t = target[n];
      const LogSoftmaxStats<T> row = log_softmax_stats(size, xs + offset);
      st[2 * n] = row.m;
      st[2 * n + 1] = row.log_total;
      const bool ok = t != ignore_index;
      out[n] = ok ? -((xs[offset + t] - row.m) - row.log_total) : T(0);
      mask[n] = ok ? T(1) : T(0);
    });
  });
}

void cross_entropy_rows_backward_cpu(DType dtype, int64_t rows, int64_t size, const void* x, const void* stats,
                                     const int64_t* target, int64_t ignore_index, const void* grad, void* dx) {
  check_softmax_args("cross_entropy_rows_backward_cpu", SoftmaxKind::LogSoftmax, rows, size, 1);
  if (rows == 0 || size == 0) return;
  dispatch_float(dtype, "cross_entropy_rows_backward_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *xs = static_cast<const T*>(x), *st = static_cast<const T*>(stats), *g = static_cast<const T*>(grad);
    T* dxs = static_cast<T*>(dx);
    for_each_slice(rows, size, 1, [&](int64_t offset, int64_t) {
      const int64_t n = offset / size, t = target[n];
      const bool ok = t != ignore_index;
      cross_entropy_row_backward(size, xs + offset, LogSoftmaxStats<T>{st[2 * n], st[2 * n + 1]}, ok ? t : -1,
                                 ok ? T(-g[n]) : T(0), dxs + offset);
    });
  });
}

void softmax_row_cpu(int64_t size, const float* x, float* y) { softmax_row(SoftmaxKind::Softmax, size, x, y); }

void softmax_backward_row_cpu(int64_t size, const float* y, const float* dy, float* dx) {
  softmax_backward_row(SoftmaxKind::Softmax, size, y, dy, dx);
}

// x, y: (outer, size, inner)
void softmax_cpu(SoftmaxKind kind, DType dtype, int64_t outer, int64_t size, int64_t inner, const void* x, void* y) {
  check_softmax_args("softmax_cpu", kind, outer, size, inner);
  if (outer == 0 || size == 0 || inner == 0) return;
  dispatch_float(dtype, "softmax_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xs = static_cast<const T*>(x);
    T* ys = static_cast<T*>(y);
    for_each_slice(outer, size, inner, [&](int64_t offset, int64_t w) {
      if (inner == 1) {
        softmax_row(kind, size, xs + offset, ys + offset);
      } else {
        softmax_columns(kind, size, inner, w, xs + offset, ys + offset);
      }
    });
  });
}

// y, dy, dx: (outer, size, inner)
void softmax_backward_cpu(SoftmaxKind kind, DType dtype, int64_t outer, int64_t size, int64_t inner, const void* y,
                          const void* dy, void* dx) {
  check_softmax_args("softmax_backward_cpu", kind, outer, size, inner);
  if (outer == 0 || size == 0 || inner == 0) return;
  dispatch_float(dtype, "softmax_backward_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* ys = static_cast<const T*>(y);
    const T* dys = static_cast<const T*>(dy);
    T* dxs = static_cast<T*>(dx);
    for_each_slice(outer, size, inner, [&](int64_t offset, int64_t w) {
      if (inner == 1) {
        softmax_backward_row(kind, size, ys + offset, dys + offset, dxs + offset);
      } else {
        softmax_backward_columns(kind, size, inner, w, ys + offset, dys + offset, dxs + offset);
      }
    });
  });
}

}  // namespace dpe::kernels
