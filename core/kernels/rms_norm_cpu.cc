// CPU RMSNorm (core/kernels/rms_norm.h): one pass over x forward and one over (x, dy) backward, where the
// composition of square, mean, add, rsqrt and two muls made six forward and, through autograd, more backward,
// each a full pass over the activations: on tiny-llama the saved activations come back from memory, and the
// composed backward's MulBackward nodes took 15% of its backward on one core (docs/BENCHMARKS.md).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/kernels/arg_checks.h"
#include "core/kernels/cpu_parallel.h"
#include "core/kernels/dtype_dispatch.h"
#include "core/kernels/lane_sum.h"
#include "core/kernels/rms_norm.h"

namespace dpe::kernels {
namespace {

constexpr int64_t kRowsPerBlock = 64;  // rows per partial sum of dweight

// sum over i < d of a[i] * b[i], in detail::sum_in_lanes's fixed order.
template <typename T>
T dot(const T* a, const T* b, int64_t d) {
  return detail::sum_in_lanes<T>(d, [&](int64_t i) { return a[i] * b[i]; });
}

}  // namespace

void rms_norm_forward_cpu(DType dtype, int64_t rows, int64_t d, const void* x, const void* weight, double eps,
                          void* y, void* rstd) {
  detail::check_rms_norm_shape("rms_norm_forward_cpu", rows, d);
  detail::dispatch_float(dtype, "rms_norm_forward_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xs = static_cast<const T*>(x);
    const T* w = static_cast<const T*>(weight);
    T* ys = static_cast<T*>(y);
    T* r = static_cast<T*>(rstd);
    const T e = static_cast<T>(eps);
    detail::parallel_tasks(rows, d, [&](int64_t row) {
      const T* xr = xs + row * d;
      T* yr = ys + row * d;
      const T rs = T(1) / std::sqrt(dot(xr, xr, d) / static_cast<T>(d) + e);
      r[row] = rs;
      if (w == nullptr) {
        for (int64_t i = 0; i < d; ++i) yr[i] = xr[i] * rs;
      } else {
        for (int64_t i = 0; i < d; ++i) {
          const T xhat = xr[i] * rs;
          yr[i] = xhat * w[i];
        }
      }
    });
  });
}

void rms_norm_backward_cpu(DType dtype, int64_t rows, int64_t d, const void* x, const void* weight,
                           const void* rstd, const void* dy, void* dx, void* dweight) {
  detail::check_rms_norm_shape("rms_norm_backward_cpu", rows, d);
  detail::dispatch_float(dtype, "rms_norm_backward_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xs = static_cast<const T*>(x);
    const T* w = static_cast<const T*>(weight);
    const T* r = static_cast<const T*>(rstd);
    const T* dys = static_cast<const T*>(dy);
    T* dxs = static_cast<T*>(dx);
    T* dw = static_cast<T*>(dweight);
    const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
    // Block b's sum of dy * xhat over its rows, in row order; dweight adds the blocks in block order.
    std::vector<T> partial(dw != nullptr ? static_cast<size_t>(blocks * d) : 0, T(0));
    detail::parallel_tasks(blocks, kRowsPerBlock * d, [&](int64_t b) {
      std::vector<T> weighted(w != nullptr ? static_cast<size_t>(d) : 0), xhat(static_cast<size_t>(d));
      T* sum = dw != nullptr ? partial.data() + b * d : nullptr;
      for (int64_t row = b * kRowsPerBlock; row < std::min(rows, (b + 1) * kRowsPerBlock); ++row) {
        const T* xr = xs + row * d;
        const T* dyr = dys + row * d;
        const T rs = r[row];
        for (int64_t i = 0; i < d; ++i) xhat[i] = xr[i] * rs;
        if (sum != nullptr) {
          for (int64_t i = 0; i < d; ++i) sum[i] += dyr[i] * xhat[i];
        }
        if (dxs == nullptr) continue;
        const T* g = dyr;
        if (w != nullptr) {
          for (int64_t i = 0; i < d; ++i) weighted[i] = dyr[i] * w[i];
          g = weighted.data();
        }
        const T mean_g_xhat = dot(g, xhat.data(), d) / static_cast<T>(d);
        T* dxr = dxs + row * d;
        for (int64_t i = 0; i < d; ++i) dxr[i] = rs * (g[i] - xhat[i] * mean_g_xhat);
      }
    });
    if (dw == nullptr) return;
    for (int64_t i = 0; i < d; ++i) dw[i] = T(0);
    for (int64_t b = 0; b < blocks; ++b) {
      for (int64_t i = 0; i < d; ++i) dw[i] += partial[static_cast<size_t>(b * d + i)];
    }
  });
}

}  // namespace dpe::kernels
