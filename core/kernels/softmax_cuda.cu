// CUDA softmax / log-softmax over the middle axis of (outer, size, inner), and their backward
// (core/kernels/softmax.h).
//
// Numerics follow softmax_cpu.cc: the row maximum is subtracted before exp; the sums along the axis (sum of
// exp, sum of dy * y, sum of dy) accumulate in double for both dtypes, then are rounded to T once. Rows
// (inner == 1) take one block each and sum by a fixed shared-memory tree; columns (inner > 1) take one
// thread each and sum sequentially. Either way the order is fixed, so results are deterministic, and differ
// from the CPU's only by exp's last-bit rounding and the order of the double sums.
// A NaN in a row makes the row NaN; a row of all -inf gives NaN.
// Aliasing: y may be x, and dx may be y or dy (each element is read before it is written, and a row's
// elements are written only after the row's reductions, which end with a __syncthreads).
#include <cmath>
#include <cstdint>

#include "core/kernels/arg_checks.h"
#include "core/kernels/cuda_launch.cuh"
#include "core/kernels/softmax.h"

namespace dpe::kernels {
namespace {

using detail::block_reduce;
using detail::dispatch_compute_type;
using detail::first_index;
using detail::grid_for;
using detail::grid_stride;
using detail::kBlock;
using detail::kMaxRowBlock;
using detail::MaxCombine;
using detail::row_block;
using detail::SumCombine;

// Blocks for one-block-per-row kernels: one per row, capped; kernels loop over the rest.
unsigned row_grid(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, int64_t(1) << 16)); }

// A row's maximum m and sum of exp(x - m) in double, over a block (blockDim.x = row_block(size)) by fixed
// shared-memory trees: every thread gets both. All threads of the block must call it.
template <typename T>
struct RowExpSum {
  T m;
  double sum;
};
template <typename T>
__device__ RowExpSum<T> row_max_and_exp_sum(const T* xr, int64_t size, T* max_shared, double* sum_shared) {
  T m = -INFINITY;
  for (int64_t j = threadIdx.x; j < size; j += blockDim.x) m = MaxCombine{}(m, xr[j]);
  m = block_reduce(m, max_shared, MaxCombine{});
  double sum = 0;
  for (int64_t j = threadIdx.x; j < size; j += blockDim.x) sum += static_cast<double>(exp(xr[j] - m));
  return {m, block_reduce(sum, sum_shared, SumCombine{})};
}

// x, y: (rows, size), one block (blockDim.x = row_block(size)) per row.
template <typename T>
__global__ void softmax_rows_kernel(SoftmaxKind kind, int64_t rows, int64_t size, const T* x, T* y) {
  __shared__ T max_shared[kMaxRowBlock];
  __shared__ double sum_shared[kMaxRowBlock];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {  // uniform per block
    const T* xr = x + r * size;
    T* yr = y + r * size;
    const auto [m, sum] = row_max_and_exp_sum(xr, size, max_shared, sum_shared);
    if (kind == SoftmaxKind::Softmax) {
      const T total = static_cast<T>(sum);
      for (int64_t j = threadIdx.x; j < size; j += blockDim.x) yr[j] = exp(xr[j] - m) / total;
    } else {
      const T log_total = static_cast<T>(log(sum));
      for (int64_t j = threadIdx.x; j < size; j += blockDim.x) yr[j] = (xr[j] - m) - log_total;
    }
  }
}

// x, y: (outer, size, inner), one thread per (outer, inner) column.
template <typename T>
__global__ void softmax_columns_kernel(SoftmaxKind kind, int64_t outer, int64_t size, int64_t inner, const T* x,
                                       T* y) {
  for (int64_t c = first_index(); c < outer * inner; c += grid_stride()) {
    const int64_t offset = c / inner * size * inner + c % inner;
    const T* xc = x + offset;
    T* yc = y + offset;
    T m = -INFINITY;
    for (int64_t j = 0; j < size; ++j) m = MaxCombine{}(m, xc[j * inner]);
    double sum = 0;
    for (int64_t j = 0; j < size; ++j) sum += static_cast<double>(exp(xc[j * inner] - m));
    if (kind == SoftmaxKind::Softmax) {
      const T total = static_cast<T>(sum);
      for (int64_t j = 0; j < size; ++j) yc[j * inner] = exp(xc[j * inner] - m) / total;
    } else {
      const T log_total = static_cast<T>(log(sum));
      for (int64_t j = 0; j < size; ++j) yc[j * inner] = (xc[j * inner] - m) - log_total;
    }
  }
}

// The per-element term of the backward sum: dy * y (softmax) or dy (log-softmax), in double.
template <typename T>
__device__ __forceinline__ double backward_term(SoftmaxKind kind, T y, T dy) {
  return kind == SoftmaxKind::Softmax ? static_cast<double>(dy) * static_cast<double>(y) : static_cast<double>(dy);
}

//   softmax:     dx = y * (dy - total)
//   log_softmax: dx = dy - exp(y) * total
template <typename T>
__device__ __forceinline__ T backward_value(SoftmaxKind kind, T y, T dy, T total) {
  return kind == SoftmaxKind::Softmax ? y * (dy - total) : dy - exp(y) * total;
}

// y, dy, dx: (rows, size), one block (blockDim.x = row_block(size)) per row.
template <typename T>
__global__ void softmax_backward_rows_kernel(SoftmaxKind kind, int64_t rows, int64_t size, const T* y, const T* dy,
                                             T* dx) {
  __shared__ double sum_shared[kMaxRowBlock];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {  // uniform per block
    const int64_t base = r * size;
    double sum = 0;
    for (int64_t j = threadIdx.x; j < size; j += blockDim.x) sum += backward_term(kind, y[base + j], dy[base + j]);
    const T total = static_cast<T>(block_reduce(sum, sum_shared, SumCombine{}));
    for (int64_t j = threadIdx.x; j < size; j += blockDim.x) {
      dx[base + j] = backward_value(kind, y[base + j], dy[base + j], total);
    }
  }
}

// y, dy, dx: (outer, size, inner), one thread per (outer, inner) column.
template <typename T>
__global__ void softmax_backward_columns_kernel(SoftmaxKind kind, int64_t outer, int64_t size, int64_t inner,
                                                const T* y, const T* dy, T* dx) {
  for (int64_t c = first_index(); c < outer * inner; c += grid_stride()) {
    const int64_t offset = c / inner * size * inner + c % inner;
    double sum = 0;
    for (int64_t j = 0; j < size; ++j) sum += backward_term(kind, y[offset + j * inner], dy[offset + j * inner]);
    const T total = static_cast<T>(sum);
    for (int64_t j = 0; j < size; ++j) {
      const int64_t k = offset + j * inner;
      dx[k] = backward_value(kind, y[k], dy[k], total);
    }
  }
}

// A target the loss counts: not ignore_index and a class. The op layer has checked the targets (softmax.h's
// contract); one that slips through is treated like an ignored one, so no thread reads out of bounds.
__device__ __forceinline__ bool target_ok(int64_t t, int64_t classes, int64_t ignore_index) {
  return t != ignore_index && t >= 0 && t < classes;
}

// x: (rows, size); target: (rows); stats: (rows, 3). One block (row_block(size)) per row: the row's maximum m
// and log of its sum of exps as softmax_rows_kernel's log-softmax makes them (row_max_and_exp_sum), and the
// log-probability at the target, (x[t] - m) - log_total, the element nll_mean_forward_kernel reads (0 where
// ignored).
template <typename T>
__global__ void cross_entropy_stats_kernel(int64_t rows, int64_t size, const T* x, const int64_t* target,
                                           int64_t ignore_index, T* stats) {
  __shared__ T max_shared[kMaxRowBlock];
  __shared__ double sum_shared[kMaxRowBlock];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {  // uniform per block
    const T* xr = x + r * size;
    const auto [m, sum] = row_max_and_exp_sum(xr, size, max_shared, sum_shared);
    if (threadIdx.x != 0) continue;  // every thread still meets the next row's barriers
    const T log_total = static_cast<T>(log(sum));
    const int64_t t = target[r];
    stats[3 * r] = m;
    stats[3 * r + 1] = log_total;
    stats[3 * r + 2] = target_ok(t, size, ignore_index) ? (xr[t] - m) - log_total : T(0);
  }
}

// One block of kMaxRowBlock threads, nll_mean_forward_kernel's sums in its order: thread t sums rows t,
// t + blockDim.x, ... (the negated log-probabilities at the targets, and the count), then fixed trees.
template <typename T>
__global__ void cross_entropy_mean_kernel(int64_t rows, int64_t size, const T* stats, const int64_t* target,
                                          int64_t ignore_index, T* out, T* count) {
  __shared__ double shared[kMaxRowBlock];
  double loss = 0, valid = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    if (!target_ok(target[r], size, ignore_index)) continue;
    loss -= static_cast<double>(stats[3 * r + 2]);
    valid += 1;
  }
  loss = block_reduce(loss, shared, SumCombine{});
  valid = block_reduce(valid, shared, SumCombine{});
  if (threadIdx.x == 0) {
    *count = static_cast<T>(valid);
    *out = static_cast<T>(loss) / static_cast<T>(valid);
  }
}

// x, dx: (rows, size); stats: (rows, 3); target: (rows); grad_out, count: one element. A block per row, its
// threads over the row: log-softmax's backward (softmax_backward_rows_kernel's arithmetic) of
// nll_mean_backward_kernel's gradient, g = -(grad_out / count) at the target and 0 elsewhere (all 0 where
// ignored), whose row sum is g itself; y is recomputed from x and the stats.
template <typename T>
__global__ void cross_entropy_mean_backward_kernel(int64_t rows, int64_t size, const T* x, const T* stats,
                                                   const int64_t* target, int64_t ignore_index, const T* grad_out,
                                                   const T* count, T* dx) {
  const T g = -(*grad_out / *count);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t t = target[r];
    const T total = target_ok(t, size, ignore_index) ? g : T(0);
    const T m = stats[3 * r], log_total = stats[3 * r + 1];
    const T* xr = x + r * size;
    T* dxr = dx + r * size;
    for (int64_t j = threadIdx.x; j < size; j += blockDim.x) {
      const T dy = j == t ? total : T(0);
      const T y = (xr[j] - m) - log_total;
      dxr[j] = dy - exp(y) * total;
    }
  }
}

}  // namespace

// x, y: (outer, size, inner)
void softmax_cuda(cudaStream_t stream, SoftmaxKind kind, DType dtype, int64_t outer, int64_t size, int64_t inner,
                  const void* x, void* y) {
  detail::check_softmax_args("softmax_cuda", kind, outer, size, inner);
  if (outer == 0 || size == 0 || inner == 0) return;
  dispatch_compute_type(dtype, "softmax_cuda", [&](auto tag) {
    using T = decltype(tag);
    const T* xs = static_cast<const T*>(x);
    T* ys = static_cast<T*>(y);
    if (inner == 1) {
      softmax_rows_kernel<T><<<row_grid(outer), row_block(size), 0, stream>>>(kind, outer, size, xs, ys);
    } else {
      softmax_columns_kernel<T><<<grid_for(outer * inner), kBlock, 0, stream>>>(kind, outer, size, inner, xs, ys);
    }
    DPE_CUDA_CHECK_LAUNCH();
  });
}

// y, dy, dx: (outer, size, inner)
void softmax_backward_cuda(cudaStream_t stream, SoftmaxKind kind, DType dtype, int64_t outer, int64_t size,
                           int64_t inner, const void* y, const void* dy, void* dx) {
  detail::check_softmax_args("softmax_backward_cuda", kind, outer, size, inner);
  if (outer == 0 || size == 0 || inner == 0) return;
  dispatch_compute_type(dtype, "softmax_backward_cuda", [&](auto tag) {
    using T = decltype(tag);
    const T* ys = static_cast<const T*>(y);
    const T* dys = static_cast<const T*>(dy);
    T* dxs = static_cast<T*>(dx);
    if (inner == 1) {
      softmax_backward_rows_kernel<T><<<row_grid(outer), row_block(size), 0, stream>>>(kind, outer, size, ys, dys,
                                                                                      dxs);
    } else {
      softmax_backward_columns_kernel<T><<<grid_for(outer * inner), kBlock, 0, stream>>>(kind, outer, size, inner,
                                                                                         ys, dys, dxs);
    }
    DPE_CUDA_CHECK_LAUNCH();
  });
}

// x: (rows, size); target: (rows); out, count: one element; stats: (rows, 3)
void cross_entropy_mean_forward_cuda(cudaStream_t stream, DType dtype, int64_t rows, int64_t size, const void* x,
                                     const int64_t* target, int64_t ignore_index, void* out, void* count,
                                     void* stats) {
  detail::check_softmax_args("cross_entropy_mean_forward_cuda", SoftmaxKind::LogSoftmax, rows, size, 1);
  dispatch_compute_type(dtype, "cross_entropy_mean_forward_cuda", [&](auto tag) {
    using T = decltype(tag);
    if (rows > 0 && size > 0) {
      cross_entropy_stats_kernel<T><<<row_grid(rows), row_block(size), 0, stream>>>(
          rows, size, static_cast<const T*>(x), target, ignore_index, static_cast<T*>(stats));
      DPE_CUDA_CHECK_LAUNCH();
    }
    cross_entropy_mean_kernel<T><<<1, kMaxRowBlock, 0, stream>>>(rows, size, static_cast<const T*>(stats), target,
                                                                 ignore_index, static_cast<T*>(out),
                                                                 static_cast<T*>(count));
    DPE_CUDA_CHECK_LAUNCH();
  });
}

// x, dx: (rows, size); stats: (rows, 3); target: (rows); grad_out, count: one element
void cross_entropy_mean_backward_cuda(cudaStream_t stream, DType dtype, int64_t rows, int64_t size, const void* x,
                                      const void* stats, const int64_t* target, int64_t ignore_index,
                                      const void* grad_out, const void* count, void* dx) {
  detail::check_softmax_args("cross_entropy_mean_backward_cuda", SoftmaxKind::LogSoftmax, rows, size, 1);
  if (rows == 0 || size == 0) return;
  dispatch_compute_type(dtype, "cross_entropy_mean_backward_cuda", [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_mean_backward_kernel<T><<<row_grid(rows), kBlock, 0, stream>>>(
        rows, size, static_cast<const T*>(x), static_cast<const T*>(stats), target, ignore_index,
        static_cast<const T*>(grad_out), static_cast<const T*>(count), static_cast<T*>(dx));
    DPE_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dpe::kernels
