// CPU batch normalisation passes (core/kernels/batch_norm.h).
//
// Every pass runs one task per (n, c) plane of S values, in memory order. The reductions (stats,
// backward_reduce) sum each plane in double, then merge a channel's planes in n order on the calling thread:
// bit-identical for any thread count. The elementwise passes hoist the channel's constants, so the inner loop
// is a vectorisable a * x + b.
// Thread-safety: independent tasks under tbb::parallel_for in the caller's task_arena.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/kernels/arg_checks.h"
#include "core/kernels/batch_norm.h"
#include "core/kernels/batch_norm_pieces.h"
#include "core/kernels/cpu_parallel.h"
#include "core/kernels/dtype_dispatch.h"

namespace dpe::kernels {
namespace {

using detail::dispatch_float;
using detail::parallel_tasks;
using detail::RunningMoments;
using detail::write_stats_extras;

// value of an optional per-channel vector, or `otherwise` when it is null.
template <typename T>
double at(const T* v, int64_t c, double otherwise) {
  return v != nullptr ? static_cast<double>(v[c]) : otherwise;
}

// sum over i in [0, n) of f(i), in double, in kLanes interleaved partial sums added in a fixed order: the
// same result on every run, and independent chains that vectorise (one chain of dependent double additions
// ran at one element per add latency, slower than the composed ops it replaced).
constexpr int64_t kLanes = 8;

template <typename F>
double lane_sum(int64_t n, const F& f) {
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) lane[j] += f(i + j);
  }
  for (; i < n; ++i) lane[i % kLanes] += f(i);
  double sum = 0;
  for (double v : lane) sum += v;
  return sum;
}

// Calls body(p, c, offset) for every plane p = n * C + c, its channel c and the offset p * S of its first
// value, one task each (S values of work).
template <typename F>
void for_each_plane(const BatchNormShape& s, const F& body) {
  parallel_tasks(s.n * s.c, s.s, [&](int64_t p) { body(static_cast<size_t>(p), p % s.c, p * s.s); });
}

// Channels last: (N * S) rows of C values. Reductions run over blocks of rows (about kBlockValues values each,
// a function of C only, so the blocks do not depend on the thread count), each block's per-channel sums in
// double, then the blocks merged in order. The inner loops run over the C channels of a row: contiguous,
// vectorisable.
constexpr int64_t kBlockValues = 4096;

int64_t rows_per_block(const BatchNormShape& s) {
  return std::max<int64_t>(1, kBlockValues / std::max<int64_t>(1, s.c));
}

int64_t block_count(const BatchNormShape& s) {
  const int64_t per_block = rows_per_block(s);
  return (s.n * s.s + per_block - 1) / per_block;
}

// Calls body(block, first_row, rows) for each block of rows, one task each.
template <typename F>
void for_each_block(const BatchNormShape& s, const F& body) {
  const int64_t rows = s.n * s.s, per_block = rows_per_block(s);
  parallel_tasks(block_count(s), per_block * s.c, [&](int64_t b) {
    const int64_t first = b * per_block;
    body(static_cast<size_t>(b), first, std::min(per_block, rows - first));
  });
}

template <typename T>
void stats_channels_last(const BatchNormShape& s, const T* x, T* mean, T* var) {
  const size_t c = static_cast<size_t>(s.c), blocks = static_cast<size_t>(block_count(s));
  std::vector<double> block_mean(blocks * c), block_m2(block_mean.size()), block_rows(blocks);
  for_each_block(s, [&](size_t b, int64_t first, int64_t rows) {
    double* mu = &block_mean[b * c];
    double* m2 = &block_m2[b * c];
    for (int64_t r = first; r < first + rows; ++r) {
      const T* row = x + r * s.c;
      for (size_t k = 0; k < c; ++k) mu[k] += static_cast<double>(row[k]);
    }
    for (size_t k = 0; k < c; ++k) mu[k] /= static_cast<double>(rows);
    for (int64_t r = first; r < first + rows; ++r) {
      const T* row = x + r * s.c;
      for (size_t k = 0; k < c; ++k) {
        const double d = row[k] - mu[k];
        m2[k] += d * d;
      }
    }
    block_rows[b] = static_cast<double>(rows);
  });
  for (size_t k = 0; k < c; ++k) {
    RunningMoments moments;
    for (size_t b = 0; b < block_rows.size(); ++b) {
      moments.merge(block_rows[b], block_mean[b * c + k], block_m2[b * c + k]);
    }
    mean[k] = static_cast<T>(moments.mean);
    var[k] = static_cast<T>(moments.m2 / moments.count);
  }
}

// out[r, k] = in[r, k] * scale[k] + shift[k] over (N * S) rows of C.
template <typename T>
void affine_channels_last(const BatchNormShape& s, const T* in, const std::vector<T>& scale,
                          const std::vector<T>& shift, T* out) {
  for_each_block(s, [&](size_t, int64_t first, int64_t rows) {
    for (int64_t r = first; r < first + rows; ++r) {
      const T* x = in + r * s.c;
      T* y = out + r * s.c;
      for (int64_t k = 0; k < s.c; ++k) y[k] = x[k] * scale[static_cast<size_t>(k)] + shift[static_cast<size_t>(k)];
    }
  });
}

template <typename T>
void backward_reduce_channels_last(const BatchNormShape& s, const T* dy, const T* x, const T* mean, T* sum_dy,
                                   T* sum_dy_xmu) {
  const size_t c = static_cast<size_t>(s.c), blocks = static_cast<size_t>(block_count(s));
  std::vector<double> block_g(blocks * c), block_gx(block_g.size());
  for_each_block(s, [&](size_t b, int64_t first, int64_t rows) {
    double* g = &block_g[b * c];
    double* gx = &block_gx[b * c];
    for (int64_t r = first; r < first + rows; ++r) {
      const T *grad = dy + r * s.c, *in = x + r * s.c;
      for (size_t k = 0; k < c; ++k) {
        g[k] += static_cast<double>(grad[k]);
        gx[k] += static_cast<double>(grad[k]) * (static_cast<double>(in[k]) - static_cast<double>(mean[k]));
      }
    }
  });
  for (size_t k = 0; k < c; ++k) {
    double sum = 0, sum_xmu = 0;
    for (size_t b = 0; b < blocks; ++b) {
      sum += block_g[b * c + k];
      sum_xmu += block_gx[b * c + k];
    }
    sum_dy[k] = static_cast<T>(sum);
    sum_dy_xmu[k] = static_cast<T>(sum_xmu);
  }
}

// mean and var of every channel (batch_norm.h): channels last, or planes then Chan's update per channel.
template <typename T>
void stats(const BatchNormShape& s, const T* x, T* mean, T* var) {
  if (s.channels_last) {
    stats_channels_last(s, x, mean, var);
    return;
  }
  // Each plane's mean and squared deviations (two passes over S values, the second from cache), in memory
  // order; then per channel Chan's update merges its planes in n order.
  std::vector<double> plane_mean(static_cast<size_t>(s.n * s.c)), plane_m2(plane_mean.size());
  for_each_plane(s, [&](size_t p, int64_t, int64_t offset) {
    const T* plane = x + offset;
    const double mu = lane_sum(s.s, [&](int64_t i) { return static_cast<double>(plane[i]); }) /
                      static_cast<double>(s.s);
    const double m2 = lane_sum(s.s, [&](int64_t i) {
      const double d = plane[i] - mu;
      return d * d;
    });
    plane_mean[p] = mu;
    plane_m2[p] = m2;
  });
  for (int64_t c = 0; c < s.c; ++c) {
    RunningMoments moments;
    for (int64_t n = 0; n < s.n; ++n) {
      const size_t p = static_cast<size_t>(n * s.c + c);
      moments.merge(static_cast<double>(s.s), plane_mean[p], plane_m2[p]);
    }
    mean[c] = static_cast<T>(moments.mean);
    var[c] = static_cast<T>(moments.m2 / moments.count);
  }
}

}  // namespace

void batch_norm_stats_cpu(const BatchNormShape& s, const void* x, void* mean, void* var,
                          const BatchNormStatsExtras& extras) {
  detail::check_batch_norm_shape("batch_norm_stats_cpu", s, /*needs_values=*/true);
  dispatch_float(s.dtype, "batch_norm_stats_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    stats(s, static_cast<const T*>(x), static_cast<T*>(mean), static_cast<T*>(var));
    for (int64_t c = 0; c < s.c; ++c) {
      write_stats_extras(extras, c, s.n * s.s, static_cast<T*>(mean)[c], static_cast<T*>(var)[c]);
    }
  });
}

void batch_norm_elemt_cpu(const BatchNormShape& s, const void* x, const void* mean, const void* invstd,
                          const void* weight, const void* bias, void* y) {
  detail::check_batch_norm_shape("batch_norm_elemt_cpu", s);
  dispatch_float(s.dtype, "batch_norm_elemt_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *xs = static_cast<const T*>(x), *ms = static_cast<const T*>(mean), *is = static_cast<const T*>(invstd);
    const T *ws = static_cast<const T*>(weight), *bs = static_cast<const T*>(bias);
    if (s.channels_last) {
      // y = x * scale + (shift - mean * scale): rounded differently from the NCHW loop's (x - mean) * scale.
      std::vector<T> scale(static_cast<size_t>(s.c)), shift(scale.size());
      for (int64_t c = 0; c < s.c; ++c) {
        scale[static_cast<size_t>(c)] = static_cast<T>(is[c] * at(ws, c, 1.0));
        shift[static_cast<size_t>(c)] = static_cast<T>(at(bs, c, 0.0) - ms[c] * scale[static_cast<size_t>(c)]);
      }
      affine_channels_last(s, xs, scale, shift, static_cast<T*>(y));
      return;
    }
    for_each_plane(s, [&](size_t, int64_t c, int64_t offset) {
      const T mu = ms[c], scale = static_cast<T>(is[c] * at(ws, c, 1.0)), shift = static_cast<T>(at(bs, c, 0.0));
      const T* in = xs + offset;
      T* out = static_cast<T*>(y) + offset;
      for (int64_t i = 0; i < s.s; ++i) out[i] = (in[i] - mu) * scale + shift;
    });
  });
}

void batch_norm_backward_reduce_cpu(const BatchNormShape& s, const void* dy, const void* x, const void* mean,
                                    void* sum_dy, void* sum_dy_xmu) {
  detail::check_batch_norm_shape("batch_norm_backward_reduce_cpu", s);
  dispatch_float(s.dtype, "batch_norm_backward_reduce_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (s.channels_last) {
      backward_reduce_channels_last(s, static_cast<const T*>(dy), static_cast<const T*>(x),
                                    static_cast<const T*>(mean), static_cast<T*>(sum_dy), static_cast<T*>(sum_dy_xmu));
      return;
    }
    // Per plane in memory order, then per channel over its planes in n order.
    std::vector<double> plane_g(static_cast<size_t>(s.n * s.c)), plane_gx(plane_g.size());
    for_each_plane(s, [&](size_t p, int64_t c, int64_t offset) {
      const T *g = static_cast<const T*>(dy) + offset, *in = static_cast<const T*>(x) + offset;
      const double mu = static_cast<const T*>(mean)[c];
      plane_g[p] = lane_sum(s.s, [&](int64_t i) { return static_cast<double>(g[i]); });
      plane_gx[p] = lane_sum(s.s, [&](int64_t i) { return static_cast<double>(g[i]) * (in[i] - mu); });
    });
    for (int64_t c = 0; c < s.c; ++c) {
      double sum = 0, sum_xmu = 0;
      for (int64_t n = 0; n < s.n; ++n) {
        sum += plane_g[static_cast<size_t>(n * s.c + c)];
        sum_xmu += plane_gx[static_cast<size_t>(n * s.c + c)];
      }
      static_cast<T*>(sum_dy)[c] = static_cast<T>(sum);
      static_cast<T*>(sum_dy_xmu)[c] = static_cast<T>(sum_xmu);
    }
  });
}

void batch_norm_backward_elemt_cpu(const BatchNormShape& s, bool batch_stats, const void* dy, const void* x,
                                   const void* mean, const void* invstd, const void* weight, const void* sum_dy,
                                   const void* sum_dy_xmu, void* dx) {
  detail::check_batch_norm_shape("batch_norm_backward_elemt_cpu", s, batch_stats);
  dispatch_float(s.dtype, "batch_norm_backward_elemt_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *dys = static_cast<const T*>(dy), *xs = static_cast<const T*>(x), *ws = static_cast<const T*>(weight);
    const double inv_m = batch_stats ? 1.0 / static_cast<double>(s.n * s.s) : 0.0;
    if (s.channels_last) {
      // dx = dy * scale' + (x * proj' + shift'), the per-channel constants folded:
      //   batch statistics: (dy - grad_mean - (x - mu) proj) * scale = dy * scale - x * proj * scale
      //                     + (mu * proj - grad_mean) * scale.
      const size_t c = static_cast<size_t>(s.c);
      std::vector<T> dy_scale(c), x_scale(c), shift(c);
      for (size_t k = 0; k < c; ++k) {
        const double inv = static_cast<const T*>(invstd)[k], scale = inv * at(ws, static_cast<int64_t>(k), 1.0);
        dy_scale[k] = static_cast<T>(scale);
        if (batch_stats) {
          const double mu = static_cast<const T*>(mean)[k];
          const double grad_mean = static_cast<const T*>(sum_dy)[k] * inv_m;
          const double proj = static_cast<const T*>(sum_dy_xmu)[k] * inv_m * inv * inv;
          x_scale[k] = static_cast<T>(-proj * scale);
          shift[k] = static_cast<T>((mu * proj - grad_mean) * scale);
        }
      }
      T* out = static_cast<T*>(dx);
      for_each_block(s, [&](size_t, int64_t first, int64_t rows) {
        for (int64_t r = first; r < first + rows; ++r) {
          const T* g = dys + r * s.c;
          T* o = out + r * s.c;
          if (!batch_stats) {
            for (size_t k = 0; k < c; ++k) o[k] = g[k] * dy_scale[k];
            continue;
          }
          const T* in = xs + r * s.c;
          for (size_t k = 0; k < c; ++k) o[k] = g[k] * dy_scale[k] + in[k] * x_scale[k] + shift[k];
        }
      });
      return;
    }
    for_each_plane(s, [&](size_t, int64_t c, int64_t offset) {
      const double inv = static_cast<const T*>(invstd)[c];
      const T scale = static_cast<T>(inv * at(ws, c, 1.0));
      const T* g = dys + offset;
      T* out = static_cast<T*>(dx) + offset;
      if (!batch_stats) {
        for (int64_t i = 0; i < s.s; ++i) out[i] = g[i] * scale;
        return;
      }
      const T mu = static_cast<const T*>(mean)[c];
      const T grad_mean = static_cast<T>(static_cast<const T*>(sum_dy)[c] * inv_m);
      const T proj = static_cast<T>(static_cast<const T*>(sum_dy_xmu)[c] * inv_m * inv * inv);
      const T* in = xs + offset;
      for (int64_t i = 0; i < s.s; ++i) out[i] = (g[i] - grad_mean - (in[i] - mu) * proj) * scale;
    });
  });
}

}  // namespace dpe::kernels
