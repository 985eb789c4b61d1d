// CUDA RMSNorm (core/kernels/rms_norm.h): one kernel forward, two backward, where the composition launched six
// forward (square, mean, add, rsqrt, two muls) and more through autograd, each a pass over the activations.
//
// Numerics follow rms_norm_cpu.cc: xhat = x * rstd is rounded before the weight multiplies it, and the
// backward's g = dy * weight before it is used. The row sums (x^2, g * xhat) accumulate in double for both
// dtypes over a fixed shared-memory tree and are rounded to T once; dweight sums dy * xhat over blocks of
// kRowsPerBlock rows in row order, then the blocks in block order. Every order is fixed: deterministic, and
// different from the CPU's only by the order of the row sums.
#include <cmath>
#include <cstdint>

#include "core/kernels/arg_checks.h"
#include "core/kernels/cuda_launch.cuh"
#include "core/kernels/rms_norm.h"

namespace dpe::kernels {
namespace {

using detail::block_reduce;
using detail::dispatch_compute_type;
using detail::kMaxRowBlock;
using detail::row_block;
using detail::SumCombine;

constexpr int64_t kRowsPerBlock = 64;  // rows per partial sum of dweight (rms_norm_cpu.cc's)
constexpr int kColumnBlock = 256;      // threads (columns) per block of the dweight kernels

__host__ __device__ int64_t row_blocks(int64_t rows) { return (rows + kRowsPerBlock - 1) / kRowsPerBlock; }

unsigned row_grid(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, int64_t(1) << 16)); }

// x, y: (rows, d); rstd: (rows); weight: (d) or null. One block (blockDim.x = row_block(d)) per row.
template <typename T>
__global__ void rms_norm_forward_kernel(int64_t rows, int64_t d, const T* x, const T* weight, T eps, T* y, T* rstd) {
  __shared__ double shared[kMaxRowBlock];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {  // uniform per block
    const T* xr = x + r * d;
    T* yr = y + r * d;
    double sum = 0;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) sum += static_cast<double>(xr[i]) * xr[i];
    sum = block_reduce(sum, shared, SumCombine{});
    const T rs = T(1) / sqrt(static_cast<T>(sum / static_cast<double>(d)) + eps);
    if (threadIdx.x == 0) rstd[r] = rs;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      const T xhat = xr[i] * rs;
      yr[i] = weight != nullptr ? xhat * weight[i] : xhat;
    }
  }
}

// dx = rstd * (g - xhat * sum(g * xhat) / d) with g = dy * weight (dy without one). One block per row.
template <typename T>
__global__ void rms_norm_dx_kernel(int64_t rows, int64_t d, const T* x, const T* weight, const T* rstd, const T* dy,
                                   T* dx) {
  __shared__ double shared[kMaxRowBlock];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {  // uniform per block
    const T* xr = x + r * d;
    const T* dyr = dy + r * d;
    const T rs = rstd[r];
    double sum = 0;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      const T g = weight != nullptr ? dyr[i] * weight[i] : dyr[i];
      sum += static_cast<double>(g * (xr[i] * rs));
    }
    const T mean_g_xhat = static_cast<T>(block_reduce(sum, shared, SumCombine{}) / static_cast<double>(d));
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      const T g = weight != nullptr ? dyr[i] * weight[i] : dyr[i];
      dx[r * d + i] = rs * (g - (xr[i] * rs) * mean_g_xhat);
    }
  }
}

// partial: (row_blocks(rows), d), block b's sum of dy * xhat over its rows in row order. Grid: (column blocks,
// row blocks, capped at 65535 and looped over); a thread per column.
template <typename T>
__global__ void rms_norm_dweight_partial_kernel(int64_t rows, int64_t d, const T* x, const T* rstd, const T* dy,
                                                T* partial) {
  const int64_t column = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (column >= d) return;
  for (int64_t b = blockIdx.y; b < row_blocks(rows); b += gridDim.y) {
    T sum = 0;
    const int64_t end = (b + 1) * kRowsPerBlock < rows ? (b + 1) * kRowsPerBlock : rows;
    for (int64_t r = b * kRowsPerBlock; r < end; ++r) sum += dy[r * d + column] * (x[r * d + column] * rstd[r]);
    partial[b * d + column] = sum;
  }
}

// dweight[i] = the blocks' partial sums of column i, added in block order.
template <typename T>
__global__ void rms_norm_dweight_sum_kernel(int64_t blocks, int64_t d, const T* partial, T* dweight) {
  const int64_t column = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (column >= d) return;
  T sum = 0;
  for (int64_t b = 0; b < blocks; ++b) sum += partial[b * d + column];
  dweight[column] = sum;
}

}  // namespace

int64_t rms_norm_backward_cuda_workspace(int64_t rows, int64_t d) { return row_blocks(rows) * d; }

void rms_norm_forward_cuda(cudaStream_t stream, DType dtype, int64_t rows, int64_t d, const void* x,
                           const void* weight, double eps, void* y, void* rstd) {
  detail::check_rms_norm_shape("rms_norm_forward_cuda", rows, d);
  if (rows == 0) return;
  dispatch_compute_type(dtype, "rms_norm_forward_cuda", [&](auto tag) {
    using T = decltype(tag);
    rms_norm_forward_kernel<T><<<row_grid(rows), row_block(d), 0, stream>>>(
        rows, d, static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<T>(eps), static_cast<T*>(y),
        static_cast<T*>(rstd));
    DPE_CUDA_CHECK_LAUNCH();
  });
}

void rms_norm_backward_cuda(cudaStream_t stream, DType dtype, int64_t rows, int64_t d, const void* x,
                            const void* weight, const void* rstd, const void* dy, void* dx, void* dweight,
                            void* workspace) {
  detail::check_rms_norm_shape("rms_norm_backward_cuda", rows, d);
  DPE_CHECK(dweight == nullptr || workspace != nullptr || rows == 0,
            "rms_norm_backward_cuda: dweight needs a workspace of rms_norm_backward_cuda_workspace(", rows, ", ", d,
            ") elements");
  dispatch_compute_type(dtype, "rms_norm_backward_cuda", [&](auto tag) {
    using T = decltype(tag);
    const T* xs = static_cast<const T*>(x);
    const T* rs = static_cast<const T*>(rstd);
    const T* dys = static_cast<const T*>(dy);
    const unsigned column_blocks = static_cast<unsigned>((d + kColumnBlock - 1) / kColumnBlock);
    if (dweight != nullptr && rows == 0) {  // a sum over no rows
      DPE_CUDA_CHECK(cudaMemsetAsync(dweight, 0, static_cast<size_t>(d) * sizeof(T), stream));
      return;
    }
    if (rows == 0) return;
    if (dx != nullptr) {
      rms_norm_dx_kernel<T><<<row_grid(rows), row_block(d), 0, stream>>>(rows, d, xs, static_cast<const T*>(weight),
                                                                          rs, dys, static_cast<T*>(dx));
      DPE_CUDA_CHECK_LAUNCH();
    }
    if (dweight != nullptr) {
      const int64_t blocks = row_blocks(rows);
      T* partial = static_cast<T*>(workspace);
      const dim3 grid(column_blocks, static_cast<unsigned>(std::min<int64_t>(blocks, 65535)));
      rms_norm_dweight_partial_kernel<T><<<grid, kColumnBlock, 0, stream>>>(rows, d, xs, rs, dys, partial);
      DPE_CUDA_CHECK_LAUNCH();
      rms_norm_dweight_sum_kernel<T><<<column_blocks, kColumnBlock, 0, stream>>>(blocks, d, partial,
                                                                                static_cast<T*>(dweight));
      DPE_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace dpe::kernels
