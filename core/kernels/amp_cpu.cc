// CPU non-finite check and unscale (core/kernels/amp.h). Elements are independent and the flag is an OR,
// so the result does not depend on how tbb splits the range.
#include <atomic>
#include <cmath>

#include "core/error.h"
#include "core/kernels/amp.h"
#include "core/kernels/arg_checks.h"
#include "core/kernels/cpu_parallel.h"
#include "core/kernels/dtype_dispatch.h"

namespace dpe::kernels {

void amp_unscale_cpu(DType dtype, int64_t n, void* grad, float inv_scale, float* found_inf) {
  detail::check_n("amp_unscale_cpu", n);
  DPE_INTERNAL_ASSERT(found_inf != nullptr, "amp_unscale_cpu: null found_inf");
  if (n == 0) return;
  detail::dispatch_float(dtype, "amp_unscale_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* g = static_cast<T*>(grad);
    const T inv = static_cast<T>(inv_scale);
    // One relaxed store per chunk that found something, read after parallel_range has joined every chunk.
    std::atomic<bool> any{false};
    detail::parallel_range(n, [&](int64_t begin, int64_t end) {
      bool bad = false;
      for (int64_t i = begin; i < end; ++i) {
        const T v = g[i];
        bad |= !std::isfinite(v);
        g[i] = v * inv;
      }
      if (bad) any.store(true, std::memory_order_relaxed);
    });
    if (any.load(std::memory_order_relaxed)) *found_inf = 1.0f;
  });
}

}  // namespace dpe::kernels
