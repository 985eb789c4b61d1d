// CUDA random fills (core/kernels/random.h). Element i is a function of (seed, offset + i) only
// (core/kernels/philox.h), so the CUDA fill equals the CPU fill whatever the grid.
//
// Each value is computed in double, then rounded to T once, exactly as random_cpu.cc does:
//   uniform:   low + (high - low) * u        u in [0, 1), 53 bits; a result that rounds up to `high` is
//                                            moved to the largest T below it, so it lies in [low, high)
//   normal:    mean + std * z                z by Box-Muller (philox_normal)
//   bernoulli: u < p ? 1 : 0
// The multiply-adds are fma (one rounding): GCC contracts the CPU's `a + b * c` into an FMA on FMA hardware
// at -O1 and above, so uniform and bernoulli are bit-identical to the CPU fills (in an unoptimised CPU build
// uniform may differ in the last bit). normal also differs where CUDA's log/cos round differently from glibc's.
#include <cstdint>

#include "core/kernels/arg_checks.h"
#include "core/kernels/cuda_launch.cuh"
#include "core/kernels/philox.h"
#include "core/kernels/random.h"

namespace dpe::kernels {
namespace {

using detail::dispatch_compute_type;
using detail::first_index;
using detail::grid_for;
using detail::grid_stride;
using detail::kBlock;
using detail::check_n;

// out: (n)
template <typename T>
__global__ void uniform_kernel(int64_t n, PhiloxState state, double low, double high, T* out) {
  const double scale = high - low;
  const T lo = static_cast<T>(low), hi = static_cast<T>(high);
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const double u = philox_uniform(philox4x32_10(state.seed, state.offset + static_cast<uint64_t>(i)));
    T v = static_cast<T>(fma(scale, u, low));
    if (v >= hi && hi > lo) v = nextafter(hi, lo);
    out[i] = v;
  }
}

// out: (n)
template <typename T>
__global__ void normal_kernel(int64_t n, PhiloxState state, double mean, double std, T* out) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const double z = philox_normal(philox4x32_10(state.seed, state.offset + static_cast<uint64_t>(i)));
    out[i] = static_cast<T>(fma(std, z, mean));
  }
}

// out: (n)
template <typename T>
__global__ void bernoulli_kernel(int64_t n, PhiloxState state, double p, T* out) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const double u = philox_uniform(philox4x32_10(state.seed, state.offset + static_cast<uint64_t>(i)));
    out[i] = u < p ? T(1) : T(0);
  }
}

}  // namespace

// out: (n)
void uniform_cuda(cudaStream_t stream, DType dtype, int64_t n, PhiloxState state, double low, double high,
                  void* out) {
  check_n("uniform_cuda", n);
  DPE_CHECK(low <= high, "uniform_cuda: low ", low, " > high ", high);
  if (n == 0) return;
  dispatch_compute_type(dtype, "uniform_cuda", [&](auto tag) {
    using T = decltype(tag);
    uniform_kernel<T><<<grid_for(n), kBlock, 0, stream>>>(n, state, low, high, static_cast<T*>(out));
    DPE_CUDA_CHECK_LAUNCH();
  });
}

// out: (n)
void normal_cuda(cudaStream_t stream, DType dtype, int64_t n, PhiloxState state, double mean, double std,
                 void* out) {
  check_n("normal_cuda", n);
  DPE_CHECK(std >= 0, "normal_cuda: std ", std, " is negative");
  if (n == 0) return;
  dispatch_compute_type(dtype, "normal_cuda", [&](auto tag) {
    using T = decltype(tag);
    normal_kernel<T><<<grid_for(n), kBlock, 0, stream>>>(n, state, mean, std, static_cast<T*>(out));
    DPE_CUDA_CHECK_LAUNCH();
  });
}

// out: (n)
void bernoulli_cuda(cudaStream_t stream, DType dtype, int64_t n, PhiloxState state, double p, void* out) {
  check_n("bernoulli_cuda", n);
  DPE_CHECK(p >= 0 && p <= 1, "bernoulli_cuda: p ", p, " is outside [0, 1]");
  if (n == 0) return;
  dispatch_compute_type(dtype, "bernoulli_cuda", [&](auto tag) {
    using T = decltype(tag);
    bernoulli_kernel<T><<<grid_for(n), kBlock, 0, stream>>>(n, state, p, static_cast<T*>(out));
    DPE_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dpe::kernels
