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
//
// Note [Split reductions]
// One block per (outer, tile) starves the GPU when outputs are few and the axis is long: a norm's or a bias's
// weight gradient over B*T rows (outer 1, size 16384, inner 128) got 4 blocks, whose threads each walked
// 2048 elements one load after another. Such an axis is cut into `chunks` pieces of `chunk_len` rows: pass 1
// reduces every piece into partials (outer, chunks, inner) on ~kSplitTargetBlocks blocks, pass 2 reduces the
// partials (dividing by the whole size for Mean). The pieces depend only on (outer, size, inner), so the
// result is still the same bits on every run.
#include <algorithm>
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

// x: (outer, size, inner)  y: (outer, chunks, inner), chunk c covering rows [c * chunk_len, (c + 1) * chunk_len)
// of the axis (chunks = 1, chunk_len = size: the whole axis). `identity` is the combine's neutral element;
// divisor > 0 divides every result by it (Mean).
template <typename T, typename Combine>
__global__ void reduce_kernel(int64_t outer, int64_t size, int64_t inner, int64_t chunks, int64_t chunk_len,
                              int64_t tiles_per_outer, const T* x, T* y, T identity, Combine combine,
                              int64_t divisor) {
  __shared__ T shared[kMaxRowBlock];
  const int64_t tiles_per_chunk_row = chunks * tiles_per_outer;
  for (int64_t tile = blockIdx.x; tile < outer * tiles_per_chunk_row; tile += gridDim.x) {  // uniform per block
    const int64_t o = tile / tiles_per_chunk_row;
    const int64_t c = tile % tiles_per_chunk_row / tiles_per_outer;
    const int64_t i = tile % tiles_per_outer * blockDim.x + threadIdx.x;
    const int64_t end = (c + 1) * chunk_len < size ? (c + 1) * chunk_len : size;
    T acc = identity;
    if (i < inner) {
      const T* column = x + o * size * inner + i;
      for (int64_t j = c * chunk_len + threadIdx.y; j < end; j += blockDim.y) acc = combine(acc, column[j * inner]);
    }
    acc = column_reduce(acc, shared, combine);
    if (threadIdx.y == 0 && i < inner) {
      y[(o * chunks + c) * inner + i] = divisor > 0 ? acc / static_cast<T>(divisor) : acc;
    }
  }
}

// One pass of reduce_kernel over (outer, size, inner) in `chunks` pieces of chunk_len rows.
template <typename T, typename Combine>
void launch_reduce(cudaStream_t stream, int64_t outer, int64_t size, int64_t inner, int64_t chunks,
                   int64_t chunk_len, const T* x, T* y, T identity, Combine combine, int64_t divisor) {
  const dim3 block = reduce_block(chunk_len, inner);
  int64_t tiles = 0;
  const unsigned grid = reduce_grid(outer * chunks, inner, block, &tiles);
  reduce_kernel<<<grid, block, 0, stream>>>(outer, size, inner, chunks, chunk_len, tiles, x, y, identity, combine,
                                            divisor);
  DPE_CUDA_CHECK_LAUNCH();
}

// Pieces for Note [Split reductions]: 1 (no split) unless the plain launch has fewer than
// kSplitBelowBlocks blocks and the axis holds at least two pieces of kSplitMinRows.
constexpr int64_t kSplitBelowBlocks = 128;
constexpr int64_t kSplitTargetBlocks = 512;
constexpr int64_t kSplitMinRows = 256;

int64_t split_chunks(int64_t outer, int64_t size, int64_t inner) {
  int64_t tiles = 0;
  const int64_t blocks = reduce_grid(outer, inner, reduce_block(size, inner), &tiles);
  if (blocks >= kSplitBelowBlocks || size < 2 * kSplitMinRows) return 1;
  return std::min((size + kSplitMinRows - 1) / kSplitMinRows, (kSplitTargetBlocks + blocks - 1) / blocks);
}

// reduce_kernel over the whole axis, split in two passes where Note [Split reductions] says so.
template <typename T, typename Combine>
void reduce_axis(cudaStream_t stream, int64_t outer, int64_t size, int64_t inner, const T* x, T* y, T identity,
                 Combine combine, bool mean) {
  const int64_t divisor = mean ? size : 0;
  int64_t chunks = split_chunks(outer, size, inner);
  if (chunks == 1) {
    launch_reduce(stream, outer, size, inner, 1, size, x, y, identity, combine, divisor);
    return;
  }
  const int64_t chunk_len = (size + chunks - 1) / chunks;
  chunks = (size + chunk_len - 1) / chunk_len;  // no empty last piece
  T* partials = nullptr;
  DPE_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&partials), outer * chunks * inner * sizeof(T), stream));
  try {
    launch_reduce(stream, outer, size, inner, chunks, chunk_len, x, partials, identity, combine, int64_t{0});
    launch_reduce(stream, outer, chunks, inner, int64_t{1}, chunks, partials, y, identity, combine, divisor);
  } catch (...) {
    cudaFreeAsync(partials, stream);  // best effort: already failing
    throw;
  }
  DPE_CUDA_CHECK(cudaFreeAsync(partials, stream));
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
    const T* xs = static_cast<const T*>(x);
    T* ys = static_cast<T*>(y);
    constexpr T kInf = std::numeric_limits<T>::infinity();
    switch (op) {
      case AxisReduction::Sum:
      case AxisReduction::Mean:
        reduce_axis(stream, outer, size, inner, xs, ys, T(0), SumCombine{}, op == AxisReduction::Mean);
        return;
      case AxisReduction::Max: reduce_axis(stream, outer, size, inner, xs, ys, -kInf, MaxCombine{}, false); return;
      case AxisReduction::Min: reduce_axis(stream, outer, size, inner, xs, ys, kInf, MinCombine{}, false); return;
    }
    DPE_CHECK(false, "reduce_cuda: unknown AxisReduction ", static_cast<int>(op));
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
