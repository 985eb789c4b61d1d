// CUDA batch normalisation passes (core/kernels/batch_norm.h).
//
// Note [Batch-norm reductions on CUDA]
// A per-channel reduction runs in two kernels. The first cuts each channel's M = N * S values (in (n, s)
// order) into `pieces` contiguous ranges (batch_norm_pieces.h: enough blocks to fill a GPU, at least 4096
// values each) and gives each (channel, piece) a block: every thread sums a fixed strided subset of the range in
// double and detail::block_reduce combines the threads in a fixed tree. The second combines each channel's
// pieces in piece order. The cut depends on (N, C, S) alone, so results repeat bit for bit on any GPU. The
// statistics take two passes over each piece (its mean, then squared deviations from it) and merge the pieces
// by Chan's update: two passes' accuracy, no E[x^2] - E[x]^2 cancellation; they differ from the CPU only by
// summation order. (One block per channel, the first version, kept 64 of an H100's 132 SMs busy on the CNN's
// 64 channels, each thread walking ~200 values one load after another: BatchNormBackward took 0.135 ms for a
// 13 MB activation.)
// Index arithmetic: a thread steps through its range by adding the block size's quotient and remainder by S,
// and the elementwise passes find an element's channel with Divider's multiply-highs (offset_calc.h): no
// 64-bit division per element.
#include <algorithm>
#include <cstdint>

#include "core/kernels/arg_checks.h"
#include "core/kernels/batch_norm_pieces.h"
#include "core/kernels/batch_norm.h"
#include "core/kernels/cuda_launch.cuh"
#include "core/kernels/offset_calc.h"

namespace dpe::kernels {
namespace {

using detail::batch_norm_piece;
using detail::batch_norm_split;
using detail::BatchNormPiece;
using detail::BatchNormSplit;
using detail::block_reduce;
using detail::dispatch_compute_type;
using detail::Divider;
using detail::first_index;
using detail::for_each_in_piece;
using detail::grid_for;
using detail::grid_stride;
using detail::kBlock;
using detail::kMaxRowBlock;
using detail::RunningMoments;
using detail::SumCombine;
using detail::write_stats_extras;

// grid: C * pieces blocks of kMaxRowBlock threads.
template <typename T>
__global__ void stats_pieces_kernel(int64_t n, int64_t channels, int64_t s, BatchNormSplit split, const T* x,
                                    RunningMoments* pieces) {
  __shared__ double shared[kMaxRowBlock];
  const BatchNormPiece p = batch_norm_piece(blockIdx.x, split, n * s);
  double sum = 0;
  for_each_in_piece(p, channels, s, threadIdx.x, blockDim.x, [&](int64_t k) { sum += x[k]; });
  const double count = static_cast<double>(p.hi - p.lo);
  const double mu = block_reduce(sum, shared, SumCombine{}) / count;
  double sq = 0;
  for_each_in_piece(p, channels, s, threadIdx.x, blockDim.x, [&](int64_t k) {
    const double d = x[k] - mu;
    sq += d * d;
  });
  const double m2 = block_reduce(sq, shared, SumCombine{});
  if (threadIdx.x == 0) pieces[blockIdx.x] = {count, mu, m2};
}

// Chan's update over each channel's pieces, in piece order; then the extras (invstd, the running statistics).
template <typename T>
__global__ void stats_finalize_kernel(int64_t channels, int64_t n_pieces, int64_t count,
                                      const RunningMoments* pieces, T* mean, T* var, BatchNormStatsExtras extras) {
  for (int64_t c = first_index(); c < channels; c += grid_stride()) {
    RunningMoments all;
    for (int64_t k = 0; k < n_pieces; ++k) {
      const RunningMoments& p = pieces[c * n_pieces + k];
      all.merge(p.count, p.mean, p.m2);
    }
    mean[c] = static_cast<T>(all.mean);
    var[c] = static_cast<T>(all.m2 / all.count);
    write_stats_extras(extras, c, count, mean[c], var[c]);
  }
}

// A piece's sum of dy and of dy * (x - mean).
struct GradSums {
  double dy, dy_xmu;
};

// grid: C * pieces blocks of kMaxRowBlock threads. kXmu false: the sum of dy alone (x and mean unused).
template <typename T, bool kXmu>
__global__ void backward_reduce_pieces_kernel(int64_t n, int64_t channels, int64_t s, BatchNormSplit split,
                                              const T* dy, const T* x, const T* mean, GradSums* pieces) {
  __shared__ double shared[kMaxRowBlock];
  const BatchNormPiece p = batch_norm_piece(blockIdx.x, split, n * s);
  const double mu = kXmu ? static_cast<double>(mean[p.c]) : 0.0;
  double g = 0, gx = 0;
  for_each_in_piece(p, channels, s, threadIdx.x, blockDim.x, [&](int64_t k) {
    const double d = dy[k];
    g += d;
    if constexpr (kXmu) gx += d * (x[k] - mu);
  });
  g = block_reduce(g, shared, SumCombine{});
  if constexpr (kXmu) gx = block_reduce(gx, shared, SumCombine{});
  if (threadIdx.x == 0) pieces[blockIdx.x] = {g, gx};
}

// sum_dy_xmu null: only sum_dy.
template <typename T>
__global__ void backward_reduce_finalize_kernel(int64_t channels, int64_t n_pieces, const GradSums* pieces,
                                                T* sum_dy, T* sum_dy_xmu) {
  for (int64_t c = first_index(); c < channels; c += grid_stride()) {
    double g = 0, gx = 0;
    for (int64_t k = 0; k < n_pieces; ++k) {
      g += pieces[c * n_pieces + k].dy;
      gx += pieces[c * n_pieces + k].dy_xmu;
    }
    sum_dy[c] = static_cast<T>(g);
    if (sum_dy_xmu != nullptr) sum_dy_xmu[c] = static_cast<T>(gx);
  }
}

// Runs launch_pieces(partials) then launch_finalize(partials) on `blocks` partials of type P in stream-ordered
// scratch memory (freed after both are enqueued: later work on the stream runs after them).
template <typename P, typename Pieces, typename Finalize>
void reduce_in_pieces(cudaStream_t stream, int64_t blocks, Pieces launch_pieces, Finalize launch_finalize) {
  P* partials = nullptr;
  const size_t bytes = static_cast<size_t>(blocks) * sizeof(P);
  DPE_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&partials), bytes, stream));
  try {
    launch_pieces(partials);
    launch_finalize(partials);
  } catch (...) {
    cudaFreeAsync(partials, stream);  // best effort: already failing
    throw;
  }
  DPE_CUDA_CHECK(cudaFreeAsync(partials, stream));
}

// The channel of element i of a contiguous (N, C, S) tensor of `total` elements: i / S % C.
struct ChannelOf {
  Divider by_s, by_c;
  ChannelOf(int64_t total, int64_t channels, int64_t s) : by_s(s, total), by_c(channels, total) {}
  __device__ int64_t operator()(int64_t i) const {
    const int64_t q = by_s.div(i);
    return q - by_c.div(q) * by_c.divisor;
  }
};

template <typename T>
__device__ double at(const T* v, int64_t c, double otherwise) {
  return v != nullptr ? static_cast<double>(v[c]) : otherwise;
}

template <typename T>
__global__ void elemt_kernel(int64_t total, ChannelOf channel_of, const T* x, const T* mean, const T* invstd,
                             const T* weight, const T* bias, T* y) {
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t c = channel_of(i);
    const T scale = static_cast<T>(invstd[c] * at(weight, c, 1.0)), shift = static_cast<T>(at(bias, c, 0.0));
    y[i] = (x[i] - mean[c]) * scale + shift;
  }
}

template <typename T>
__global__ void backward_elemt_kernel(int64_t total, ChannelOf channel_of, double inv_m, bool batch_stats,
                                      const T* dy, const T* x, const T* mean, const T* invstd, const T* weight,
                                      const T* sum_dy, const T* sum_dy_xmu, T* dx) {
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t c = channel_of(i);
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

void batch_norm_stats_cuda(cudaStream_t stream, const BatchNormShape& s, const void* x, void* mean, void* var,
                           const BatchNormStatsExtras& extras) {
  detail::check_batch_norm_shape("batch_norm_stats_cuda", s, /*needs_values=*/true);
  check_nchw("batch_norm_stats_cuda", s);
  if (s.c == 0) return;
  const BatchNormSplit split = batch_norm_split(s.c, s.n * s.s);
  const int64_t blocks = s.c * split.pieces;
  dispatch_compute_type(s.dtype, "batch_norm_stats_cuda", [&](auto tag) {
    using T = decltype(tag);
    reduce_in_pieces<RunningMoments>(
        stream, blocks,
        [&](RunningMoments* pieces) {
          stats_pieces_kernel<T><<<static_cast<unsigned>(blocks), kMaxRowBlock, 0, stream>>>(
              s.n, s.c, s.s, split, static_cast<const T*>(x), pieces);
          DPE_CUDA_CHECK_LAUNCH();
        },
        [&](const RunningMoments* pieces) {
          stats_finalize_kernel<T><<<grid_for(s.c), kBlock, 0, stream>>>(
              s.c, split.pieces, s.n * s.s, pieces, static_cast<T*>(mean), static_cast<T*>(var), extras);
          DPE_CUDA_CHECK_LAUNCH();
        });
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
        total, ChannelOf(total, s.c, s.s), static_cast<const T*>(x), static_cast<const T*>(mean),
        static_cast<const T*>(invstd), static_cast<const T*>(weight), static_cast<const T*>(bias), static_cast<T*>(y));
    DPE_CUDA_CHECK_LAUNCH();
  });
}

namespace {

// sum_dy and, with x (then mean and sum_dy_xmu too), sum_dy_xmu: batch_norm_backward_reduce_cuda and
// channel_sum_cuda.
void backward_reduce(cudaStream_t stream, const char* what, const BatchNormShape& s, const void* dy, const void* x,
                     const void* mean, void* sum_dy, void* sum_dy_xmu) {
  detail::check_batch_norm_shape(what, s);
  check_nchw(what, s);
  if (s.c == 0) return;
  const BatchNormSplit split = batch_norm_split(s.c, s.n * s.s);
  const int64_t blocks = s.c * split.pieces;
  dispatch_compute_type(s.dtype, what, [&](auto tag) {
    using T = decltype(tag);
    reduce_in_pieces<GradSums>(
        stream, blocks,
        [&](GradSums* pieces) {
          const dim3 grid(static_cast<unsigned>(blocks));
          if (x != nullptr) {
            backward_reduce_pieces_kernel<T, true><<<grid, kMaxRowBlock, 0, stream>>>(
                s.n, s.c, s.s, split, static_cast<const T*>(dy), static_cast<const T*>(x),
                static_cast<const T*>(mean), pieces);
          } else {
            backward_reduce_pieces_kernel<T, false><<<grid, kMaxRowBlock, 0, stream>>>(
                s.n, s.c, s.s, split, static_cast<const T*>(dy), nullptr, nullptr, pieces);
          }
          DPE_CUDA_CHECK_LAUNCH();
        },
        [&](const GradSums* pieces) {
          backward_reduce_finalize_kernel<T><<<grid_for(s.c), kBlock, 0, stream>>>(
              s.c, split.pieces, pieces, static_cast<T*>(sum_dy), static_cast<T*>(sum_dy_xmu));
          DPE_CUDA_CHECK_LAUNCH();
        });
  });
}

}  // namespace

void batch_norm_backward_reduce_cuda(cudaStream_t stream, const BatchNormShape& s, const void* dy, const void* x,
                                     const void* mean, void* sum_dy, void* sum_dy_xmu) {
  // (Empty tensors may have null data.)
  DPE_INTERNAL_ASSERT(s.n * s.c * s.s == 0 || (x != nullptr && mean != nullptr && sum_dy_xmu != nullptr),
                      "batch_norm_backward_reduce_cuda: null x, mean or sum_dy_xmu");
  backward_reduce(stream, "batch_norm_backward_reduce_cuda", s, dy, x, mean, sum_dy, sum_dy_xmu);
}

void channel_sum_cuda(cudaStream_t stream, const BatchNormShape& s, const void* dy, void* sum_dy) {
  backward_reduce(stream, "channel_sum_cuda", s, dy, nullptr, nullptr, sum_dy, nullptr);
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
        total, ChannelOf(total, s.c, s.s), inv_m, batch_stats, static_cast<const T*>(dy), static_cast<const T*>(x),
        static_cast<const T*>(mean), static_cast<const T*>(invstd), static_cast<const T*>(weight),
        static_cast<const T*>(sum_dy), static_cast<const T*>(sum_dy_xmu), static_cast<T*>(dx));
    DPE_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dpe::kernels
