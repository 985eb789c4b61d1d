// CUDA reductions over the middle axis of (outer, size, inner), and argmax (core/kernels/reduce.h).
//
// Note [Deterministic CUDA reductions]
// A block of (bx, by) threads owns bx consecutive outputs along `inner` (bx = 1 when inner == 1; up to 32
// otherwise, so that a warp's loads are coalesced) of one `outer` index. Thread (tx, ty) combines elements
// ty, ty + by, ty + 2 by, ... of its output's axis in order, then a shared-memory tree over ty combines the
// by partials in a fixed order. The order depends only on (size, inner), never on timing, so results are
// bit-identical from run to run; they differ from reduce_cpu's pairwise order only by rounding.
//
// NaN: Sum/Mean propagate it by arithmetic, Max/Min explicitly (like reduce_cpu); argmax returns the first
// NaN's index, else the first index of the maximum.
#include <cstdint>
#include <limits>

#include "core/kernels/arg_checks.h"
#include "core/kernels/cuda_launch.cuh"
#include "core/kernels/reduce.h"

namespace dpe::kernels {
namespace {

using detail::dispatch_compute_type;
using detail::kMaxRowBlock;
using detail::MaxCombine;
using detail::MinCombine;
using detail::SumCombine;

// Block shape (bx, by) for an axis of `size` with `inner` columns: powers of two, bx * by <= kMaxRowBlock.
dim3 reduce_block(int64_t size, int64_t inner) {
  int bx = 1;
  while (bx < 32 && bx < inner) bx *= 2;
  int by = 1;
  while (bx * by < kMaxRowBlock && by < size) by *= 2;
  return dim3(bx, by);
}

// Blocks: one per (outer, tile of bx columns), capped; kernels loop over the rest.
unsigned reduce_grid(int64_t outer, int64_t inner, dim3 block, int64_t* tiles_per_outer) {
  *tiles_per_outer = (inner + block.x - 1) / block.x;
  return static_cast<unsigned>(std::min<int64_t>(outer * *tiles_per_outer, int64_t(1) << 16));
}

// Combines v over threadIdx.y for each threadIdx.x in a fixed tree order (Note [Deterministic CUDA
// reductions]); the result is valid in threads with threadIdx.y == 0. All threads must call it.
template <typename T, typename Combine>
__device__ T column_reduce(T v, T* shared, Combine combine) {
  const int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x;
  shared[ty * bx + tx] = v;
  __syncthreads();
  for (int s = blockDim.y / 2; s > 0; s >>= 1) {
    if (ty < s) shared[ty * bx + tx] = combine(shared[ty * bx + tx], shared[(ty + s) * bx + tx]);
    __syncthreads();
  }
  T result = shared[tx];
  __syncthreads();  // `shared` is reused by the next tile
  return result;
}

// x: (outer, size, inner)  y: (outer, inner). `identity` is the combine's neutral element.
template <typename T, typename Combine>
__global__ void reduce_kernel(int64_t outer, int64_t size, int64_t inner, int64_t tiles_per_outer, const T* x,
                              T* y, T identity, Combine combine, bool mean) {
  __shared__ T shared[kMaxRowBlock];
  for (int64_t tile = blockIdx.x; tile < outer * tiles_per_outer; tile += gridDim.x) {  // uniform per block
    const int64_t o = tile / tiles_per_outer;
    const int64_t i = tile % tiles_per_outer * blockDim.x + threadIdx.x;
    T acc = identity;
    if (i < inner) {
      const T* column = x + o * size * inner + i;
      for (int64_t j = threadIdx.y; j < size; j += blockDim.y) acc = combine(acc, column[j * inner]);
    }
    acc = column_reduce(acc, shared, combine);
    if (threadIdx.y == 0 && i < inner) y[o * inner + i] = mean ? acc / static_cast<T>(size) : acc;
  }
}

// (value, index) candidates of argmax; index -1 is "no element yet".
template <typename T>
struct Candidate {
  T value;
  int64_t index;
};

// The better of two candidates: NaN beats numbers, larger beats smaller, and among equals (or two NaNs)
// the lower index wins. A total order, so any combination tree finds the same winner.
struct ArgmaxCombine {
  template <typename T>
  __device__ Candidate<T> operator()(Candidate<T> a, Candidate<T> b) const {
    if (a.index < 0) return b;
    if (b.index < 0) return a;
    const bool a_nan = a.value != a.value, b_nan = b.value != b.value;
    if (a_nan != b_nan) return a_nan ? a : b;
    if (!a_nan && a.value != b.value) return a.value > b.value ? a : b;
    return a.index < b.index ? a : b;
  }
};

// x: (outer, size, inner)  indices: (outer, inner)
template <typename T>
__global__ void argmax_kernel(int64_t outer, int64_t size, int64_t inner, int64_t tiles_per_outer, const T* x,
                              int64_t* indices) {
  __shared__ Candidate<T> shared[kMaxRowBlock];
  const ArgmaxCombine combine;
  for (int64_t tile = blockIdx.x; tile < outer * tiles_per_outer; tile += gridDim.x) {  // uniform per block
    const int64_t o = tile / tiles_per_outer;
    const int64_t i = tile % tiles_per_outer * blockDim.x + threadIdx.x;
    Candidate<T> best{T(0), -1};
    if (i < inner) {
      const T* column = x + o * size * inner + i;
      for (int64_t j = threadIdx.y; j < size; j += blockDim.y) best = combine(best, Candidate<T>{column[j * inner], j});
    }
    best = column_reduce(best, shared, combine);
    if (threadIdx.y == 0 && i < inner) indices[o * inner + i] = best.index;
  }
}

}  // namespace

// x: (outer, size, inner)  y: (outer, inner)
void reduce_cuda(cudaStream_t stream, AxisReduction op, DType dtype, int64_t outer, int64_t size, int64_t inner,
                 const void* x, void* y) {
  detail::check_axis_dims("reduce_cuda", outer, size, inner);
  DPE_CHECK(size > 0 || op == AxisReduction::Sum, "reduce_cuda: Mean/Max/Min over an empty axis (size 0, outer ", outer,
            ", inner ", inner, ")");
  if (outer == 0 || inner == 0) return;
  dispatch_compute_type(dtype, "reduce_cuda", [&](auto tag) {
    using T = decltype(tag);
    const dim3 block = reduce_block(size, inner);
    int64_t tiles = 0;
    const unsigned grid = reduce_grid(outer, inner, block, &tiles);
    const T* xs = static_cast<const T*>(x);
    T* ys = static_cast<T*>(y);
    constexpr T kInf = std::numeric_limits<T>::infinity();
    switch (op) {
      case AxisReduction::Sum:
      case AxisReduction::Mean:
        reduce_kernel<<<grid, block, 0, stream>>>(outer, size, inner, tiles, xs, ys, T(0), SumCombine{},
                                                  op == AxisReduction::Mean);
        break;
      case AxisReduction::Max:
        reduce_kernel<<<grid, block, 0, stream>>>(outer, size, inner, tiles, xs, ys, -kInf, MaxCombine{}, false);
        break;
      case AxisReduction::Min:
        reduce_kernel<<<grid, block, 0, stream>>>(outer, size, inner, tiles, xs, ys, kInf, MinCombine{}, false);
        break;
      default: DPE_CHECK(false, "reduce_cuda: unknown AxisReduction ", static_cast<int>(op));
    }
    DPE_CUDA_CHECK_LAUNCH();
  });
}

// x: (outer, size, inner)  indices: (outer, inner)
void argmax_cuda(cudaStream_t stream, DType dtype, int64_t outer, int64_t size, int64_t inner, const void* x,
                 int64_t* indices) {
  detail::check_axis_dims("argmax_cuda", outer, size, inner);
  DPE_CHECK(size >= 1, "argmax_cuda: empty axis (size 0, outer ", outer, ", inner ", inner, ")");
  if (outer == 0 || inner == 0) return;
  dispatch_compute_type(dtype, "argmax_cuda", [&](auto tag) {
    using T = decltype(tag);
    const dim3 block = reduce_block(size, inner);
    int64_t tiles = 0;
    const unsigned grid = reduce_grid(outer, inner, block, &tiles);
    argmax_kernel<T><<<grid, block, 0, stream>>>(outer, size, inner, tiles, static_cast<const T*>(x), indices);
    DPE_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dpe::kernels
