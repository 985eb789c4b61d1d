// CPU batch normalisation passes (core/kernels/batch_norm.h).
//
// Every pass runs one task per (n, c) plane of S values, in memory order. The reductions (stats,
// backward_reduce) sum each plane in double, then merge a channel's planes in n order on the calling thread:
// bit-identical for any thread count. The elementwise passes hoist the channel's constants, so the inner loop
// is a vectorisable a * x + b.
// Thread-safety: independent tasks under tbb::parallel_for in the caller's task_arena.
#include <cmath>
#include <vector>

#include "core/kernels/arg_checks.h"
#include "core/kernels/batch_norm.h"
#include "core/kernels/cpu_parallel.h"
#include "core/kernels/dtype_dispatch.h"

namespace dpe::kernels {
namespace {

using detail::dispatch_float;
using detail::parallel_tasks;

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

}  // namespace

void batch_norm_stats_cpu(const BatchNormShape& s, const void* x, void* mean, void* var) {
  detail::check_batch_norm_shape("batch_norm_stats_cpu", s, /*needs_values=*/true);
  dispatch_float(s.dtype, "batch_norm_stats_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    // Each plane's mean and squared deviations (two passes over S values, the second from cache), in memory
    // order; then per channel Chan's update merges its planes in n order.
    std::vector<double> plane_mean(static_cast<size_t>(s.n * s.c)), plane_m2(plane_mean.size());
    for_each_plane(s, [&](size_t p, int64_t, int64_t offset) {
      const T* plane = static_cast<const T*>(x) + offset;
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
      double count = 0, m = 0, m2 = 0;
      for (int64_t n = 0; n < s.n; ++n) {
        const size_t p = static_cast<size_t>(n * s.c + c);
        const double total = count + static_cast<double>(s.s), delta = plane_mean[p] - m;
        m += delta * static_cast<double>(s.s) / total;
        m2 += plane_m2[p] + delta * delta * count * static_cast<double>(s.s) / total;
        count = total;
      }
      static_cast<T*>(mean)[c] = static_cast<T>(m);
      static_cast<T*>(var)[c] = static_cast<T>(m2 / count);
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
