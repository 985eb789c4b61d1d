// Launch helpers shared by the CUDA kernels (core/kernels/*_cuda.cu; include from .cu files only):
// grid sizes for grid-stride loops, int64 thread indices, dtype/op dispatch, and a deterministic
// shared-memory tree reduction.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/cuda/cuda_check.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/kernels/op_enums.h"

namespace dpe::kernels::detail {

inline constexpr int kBlock = 256;         // threads per block of the elementwise kernels
inline constexpr int kMaxRowBlock = 256;   // most threads any reduction block has (its shared arrays' size)

// Blocks for a grid-stride loop over n > 0 items with `block` threads each. Capped at 2^16 blocks (enough to
// fill any current GPU many times over); beyond that each thread takes several items.
inline unsigned grid_for(int64_t n, int block = kBlock) {
  return static_cast<unsigned>(std::min<int64_t>((n + block - 1) / block, int64_t(1) << 16));
}

// Threads for a reduction over `size` elements: a power of two in [32, kMaxRowBlock] (whole warps).
inline int row_block(int64_t size) {
  int threads = 32;
  while (threads < kMaxRowBlock && threads < size) threads *= 2;
  return threads;
}

// A grid-stride loop in int64: for (int64_t i = first_index(); i < n; i += grid_stride()).
__device__ __forceinline__ int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() { return static_cast<int64_t>(blockDim.x) * gridDim.x; }

// Calls f(T{}) with T = float or double; throws naming the kernel and dtype for any other dtype.
template <typename F>
void dispatch_compute_type(DType dtype, const char* kernel, F&& f) {
  switch (dtype) {
    case DType::Float32: f(float{}); return;
    case DType::Float64: f(double{}); return;
    default: break;
  }
  DPE_CHECK(false, kernel, ": dtype ", dtype, " is not a compute type (float32 or float64)");
}

// Calls f(std::integral_constant<Enum, op>{}) so that kernels take the op as a template argument and
// the switch in core/kernels/math.h folds away at compile time. `ops` lists every enumerator.
template <auto... ops, typename Enum, typename F>
void dispatch_op(Enum op, F&& f) {
  bool found = ((op == ops ? (f(std::integral_constant<Enum, ops>{}), true) : false) || ...);
  DPE_INTERNAL_ASSERT(found, "unknown op ", static_cast<int>(op));
}

// Reduces v over the threads of a 1-D block (blockDim.x a power of two <= kMaxRowBlock) by a shared-memory
// tree in a fixed order, so the result is deterministic. Every thread gets the result. All threads of the
// block must call it (it synchronises). shared: kMaxRowBlock elements.
template <typename T, typename Combine>
__device__ T block_reduce(T v, T* shared, Combine combine) {
  const int t = threadIdx.x;
  shared[t] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) shared[t] = combine(shared[t], shared[t + s]);
    __syncthreads();
  }
  T result = shared[0];
  __syncthreads();  // the caller may reuse `shared` at once
  return result;
}

// a + b, and max/min that propagate NaN (like PyTorch), as device functors.
struct SumCombine {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxCombine {
  template <typename T>
  __device__ T operator()(T a, T b) const { return (a > b || a != a) ? a : b; }
};
struct MinCombine {
  template <typename T>
  __device__ T operator()(T a, T b) const { return (a < b || a != a) ? a : b; }
};

}  // namespace dpe::kernels::detail
