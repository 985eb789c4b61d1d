// CPU random fills. Element i of a fill is a pure function of (state.seed, state.offset + i) through
// core/kernels/philox.h, computed in double and then rounded to dtype, so the numbers do not depend on
// threads and match the CUDA fills.
// Thread-safety: only out is written; large fills run under tbb::parallel_for in the caller's task_arena.
#include <cmath>

#include "core/error.h"
#include "core/kernels/arg_checks.h"
#include "core/kernels/cpu_parallel.h"
#include "core/kernels/dtype_dispatch.h"
#include "core/kernels/philox.h"
#include "core/kernels/random.h"

namespace dpe::kernels {
namespace {

using detail::parallel_range;
using detail::dispatch_float;

// out[i] = value(philox4x32_10(seed, offset + i)) for i in [0, n); the counter wraps modulo 2^64.
// out: (n)
template <typename F>
void philox_fill(const char* what, DType dtype, int64_t n, PhiloxState state, void* out, const F& value) {
  detail::check_n(what, n);
  if (n == 0) return;
  DPE_CHECK(out != nullptr, what, ": null output for ", n, " elements");
  dispatch_float(dtype, what, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* o = static_cast<T*>(out);
    parallel_range(n, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        o[i] = value(T{}, philox4x32_10(state.seed, state.offset + static_cast<uint64_t>(i)));
      }
    });
  });
}

}  // namespace

// out: (n). low + (high - low) * u can round up to `high` (in double when u is close to 1, and more often
// once rounded to float32), so such values are moved to the largest value below high: the result really is
// in [low, high) whenever that interval holds a value of dtype.
void uniform_cpu(DType dtype, int64_t n, PhiloxState state, double low, double high, void* out) {
  DPE_CHECK(low <= high, "uniform_cpu: low ", low, " > high ", high);
  philox_fill("uniform_cpu", dtype, n, state, out, [=](auto zero, const PhiloxOutput& r) {
    using T = decltype(zero);
    const T lo = static_cast<T>(low), hi = static_cast<T>(high);
    // std::fma: one rounding, exactly what random_cuda.cu computes, whatever the compiler flags.
    T v = static_cast<T>(std::fma(high - low, philox_uniform(r), low));
    if (v >= hi && hi > lo) v = std::nextafter(hi, lo);
    return v;
  });
}

// out: (n)
void normal_cpu(DType dtype, int64_t n, PhiloxState state, double mean, double std, void* out) {
  DPE_CHECK(std >= 0, "normal_cpu: std ", std, " is negative");
  philox_fill("normal_cpu", dtype, n, state, out, [=](auto zero, const PhiloxOutput& r) {
    return static_cast<decltype(zero)>(std::fma(std, philox_normal(r), mean));
  });
}

// out: (n), each 1 with probability p, else 0.
void bernoulli_cpu(DType dtype, int64_t n, PhiloxState state, double p, void* out) {
  DPE_CHECK(p >= 0 && p <= 1, "bernoulli_cpu: p ", p, " is outside [0, 1]");
  philox_fill("bernoulli_cpu", dtype, n, state, out, [=](auto zero, const PhiloxOutput& r) {
    using T = decltype(zero);
    return philox_uniform(r) < p ? T(1) : T(0);
  });
}

}  // namespace dpe::kernels
