// CUDA batch normalisation passes (core/kernels/batch_norm.h).
//
// Per-channel reductions: one block per channel (kMaxRowBlock threads); each thread sums a fixed strided
// subset of the channel's M values in double, then detail::block_reduce combines the threads in a fixed tree,
// so results repeat bit for bit. The statistics take two passes over the channel (mean, then squared
// deviations), like the CPU, and differ from it only by summation order. Elementwise passes: grid-stride
// loops over N * C * S.
#include <cstdint>

#include "core/kernels/arg_checks.h"
#include "core/kernels/batch_norm.h"
#include "core/kernels/cuda_launch.cuh"

namespace dpe::kernels {
namespace {

using detail::block_reduce;
using detail::dispatch_compute_type;
using detail::first_index;
using detail::grid_for;
using detail::grid_stride;
using detail::kBlock;
using detail::kMaxRowBlock;
using detail::SumCombine;

// The offset of channel c's i-th value (i in [0, M)).
__device__ __forceinline__ int64_t channel_offset(int64_t i, int64_t c, int64_t channels, int64_t s) {
  return (i / s * channels + c) * s + i % s;
}

template <typename T>
__device__ double at(const T* v, int64_t c, double otherwise) {
  return v != nullptr ? static_cast<double>(v[c]) : otherwise;
}

// grid: C blocks of kMaxRowBlock threads.
template <typename T>
__global__ void stats_kernel(int64_t n, int64_t channels, int64_t s, const T* x, T* mean, T* var) {
  __shared__ double shared[kMaxRowBlock];
  const int64_t c = blockIdx.x, m = n * s;
  double sum = 0;
  for (int64_t i = threadIdx.x; i < m; i += blockDim.x) sum += x[channel_offset(i, c, channels, s)];
  const double mu = block_reduce(sum, shared, SumCombine{}) / static_cast<double>(m);
  double sq = 0;
  for (int64_t i = threadIdx.x; i < m; i += blockDim.x) {
    const double d = x[channel_offset(i, c, channels, s)] - mu;
    sq += d * d;
  }
  const double m2 = block_reduce(sq, shared, SumCombine{});
  if (threadIdx.x == 0) {
    mean[c] = static_cast<T>(mu);
    var[c] = static_cast<T>(m2 / static_cast<double>(m));
  }
}

template <typename T>
__global__ void elemt_kernel(int64_t total, int64_t channels, int64_t s, const T* x, const T* mean,
                             const T* invstd, const T* weight, const T* bias, T* y) {
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t c = i / s % channels;
    const T scale = static_cast<T>(invstd[c] * at(weight, c, 1.0)), shift = static_cast<T>(at(bias, c, 0.0));
    y[i] = (x[i] - mean[c]) * scale + shift;
  }
}

// grid: C blocks of kMaxRowBlock threads.
template <typename T>
__global__ void backward_reduce_kernel(int64_t n, int64_t channels, int64_t s, const T* dy, const T* x,
                                       const T* mean, T* sum_dy, T* sum_dy_xmu) {
  __shared__ double shared[kMaxRowBlock];
  const int64_t c = blockIdx.x, m = n * s;
  const double mu = mean[c];
  double g = 0, gx = 0;
  for (int64_t i = threadIdx.x; i < m; i += blockDim.x) {
    const int64_t k = channel_offset(i, c, channels, s);
    const double d = dy[k];
    g += d;
    gx += d * (x[k] - mu);
  }
  g = block_reduce(g, shared, SumCombine{});
  gx = block_reduce(gx, shared, SumCombine{});
  if (threadIdx.x == 0) {
    sum_dy[c] = static_cast<T>(g);
    sum_dy_xmu[c] = static_cast<T>(gx);
  }
}

template <typename T>
__global__ void backward_elemt_kernel(int64_t total, int64_t channels, int64_t s, double inv_m, bool batch_stats,
                                      const T* dy, const T* x, const T* mean, const T* invstd, const T* weight,
                                      const T* sum_dy, const T* sum_dy_xmu, T* dx) {
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t c = i / s % channels;
    const double inv = invstd[c];
    const T scale = static_cast<T>(inv * at(weight, c, 1.0));
    if (!batch_stats) {
      dx[i] = dy[i] * scale;
      continue;
    }
    const T grad_mean = static_cast<T>(sum_dy[c] * inv_m);
    const T proj = static_cast<T>(sum_dy_xmu[c] * inv_m * inv * inv);
    dx[i] = (dy[i] - grad_mean - (x[i] - mean[c]) * proj) * scale;
  }
}

// Channels-last activations are CPU-only: batch_norm hands the CUDA kernels NCHW copies.
void check_nchw(const char* what, const BatchNormShape& s) {
  DPE_CHECK(!s.channels_last, what, ": channels-last activations are CPU-only (the op hands CUDA NCHW)");
}

}  // namespace

void batch_norm_stats_cuda(cudaStream_t stream, const BatchNormShape& s, const void* x, void* mean, void* var) {
  detail::check_batch_norm_shape("batch_norm_stats_cuda", s, /*needs_values=*/true);
  check_nchw("batch_norm_stats_cuda", s);
  if (s.c == 0) return;
  dispatch_compute_type(s.dtype, "batch_norm_stats_cuda", [&](auto tag) {
    using T = decltype(tag);
    stats_kernel<T><<<static_cast<unsigned>(s.c), kMaxRowBlock, 0, stream>>>(
        s.n, s.c, s.s, static_cast<const T*>(x), static_cast<T*>(mean), static_cast<T*>(var));
    DPE_CUDA_CHECK_LAUNCH();
  });
}

void batch_norm_elemt_cuda(cudaStream_t stream, const BatchNormShape& s, const void* x, const void* mean,
                           const void* invstd, const void* weight, const void* bias, void* y) {
  detail::check_batch_norm_shape("batch_norm_elemt_cuda", s);
  check_nchw("batch_norm_elemt_cuda", s);
  const int64_t total = s.n * s.c * s.s;
  if (total == 0) return;
  dispatch_compute_type(s.dtype, "batch_norm_elemt_cuda", [&](auto tag) {
    using T = decltype(tag);
    elemt_kernel<T><<<grid_for(total), kBlock, 0, stream>>>(
        total, s.c, s.s, static_cast<const T*>(x), static_cast<const T*>(mean), static_cast<const T*>(invstd),
        static_cast<const T*>(weight), static_cast<const T*>(bias), static_cast<T*>(y));
    DPE_CUDA_CHECK_LAUNCH();
  });
}

void batch_norm_backward_reduce_cuda(cudaStream_t stream, const BatchNormShape& s, const void* dy, const void* x,
                                     const void* mean, void* sum_dy, void* sum_dy_xmu) {
  detail::check_batch_norm_shape("batch_norm_backward_reduce_cuda", s);
  check_nchw("batch_norm_backward_reduce_cuda", s);
  if (s.c == 0) return;
  dispatch_compute_type(s.dtype, "batch_norm_backward_reduce_cuda", [&](auto tag) {
    using T = decltype(tag);
    backward_reduce_kernel<T><<<static_cast<unsigned>(s.c), kMaxRowBlock, 0, stream>>>(
        s.n, s.c, s.s, static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(mean),
        static_cast<T*>(sum_dy), static_cast<T*>(sum_dy_xmu));
    DPE_CUDA_CHECK_LAUNCH();
  });
}

void batch_norm_backward_elemt_cuda(cudaStream_t stream, const BatchNormShape& s, bool batch_stats, const void* dy,
                                    const void* x, const void* mean, const void* invstd, const void* weight,
                                    const void* sum_dy, const void* sum_dy_xmu, void* dx) {
  detail::check_batch_norm_shape("batch_norm_backward_elemt_cuda", s, batch_stats);
  check_nchw("batch_norm_backward_elemt_cuda", s);
  const int64_t total = s.n * s.c * s.s;
  if (total == 0) return;
  const double inv_m = batch_stats ? 1.0 / static_cast<double>(s.n * s.s) : 0.0;
  dispatch_compute_type(s.dtype, "batch_norm_backward_elemt_cuda", [&](auto tag) {
    using T = decltype(tag);
    backward_elemt_kernel<T><<<grid_for(total), kBlock, 0, stream>>>(
        total, s.c, s.s, inv_m, batch_stats, static_cast<const T*>(dy), static_cast<const T*>(x),
        static_cast<const T*>(mean), static_cast<const T*>(invstd), static_cast<const T*>(weight),
        static_cast<const T*>(sum_dy), static_cast<const T*>(sum_dy_xmu), static_cast<T*>(dx));
    DPE_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dpe::kernels
