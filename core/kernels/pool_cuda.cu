// CUDA pooling (core/kernels/pool.h): one thread per output element (forward) or per input element
// (backward gathers), each running the same per-element code as the CPU (pool_math.h). No atomics, so
// results are deterministic and, up to the compilers' a * b + c contraction, equal to the CPU's. Max
// pooling's backward over windows that do not overlap (stride >= window, the usual MaxPool2d(k)) scatters
// instead: one thread per output writes 0 + dy to its winner in a zeroed dx, the gather's value without its
// search over the covering outputs. Flat indices split into (plane, row, column) with Divider's multiply-highs
// (offset_calc.h), not 64-bit divisions per element.
// (cuDNN's pooling is not used: its max-pool backward recomputes the argmax from x instead of taking
// PyTorch's saved indices, and adaptive pooling is not one of its modes.)
#include <cstdint>

#include "core/kernels/cuda_launch.cuh"
#include "core/kernels/offset_calc.h"
#include "core/kernels/pool.h"
#include "core/kernels/pool_math.h"

namespace dpe::kernels {
namespace {

using detail::dispatch_compute_type;
using detail::Divider;
using detail::first_index;
using detail::grid_for;
using detail::grid_stride;
using detail::kBlock;

enum class Kind : int { Max, Avg, Adaptive };

// Element idx of a contiguous (P, rows, cols) tensor of `total` elements as (plane, row, column).
struct PlaneIndex {
  Divider by_cols, by_rows;
  PlaneIndex(int64_t total, int64_t rows, int64_t cols) : by_cols(cols, total), by_rows(rows, total) {}
  __device__ void split(int64_t idx, int64_t* p, int64_t* i, int64_t* j) const {
    const int64_t q = by_cols.div(idx);
    *j = idx - q * by_cols.divisor;
    *p = by_rows.div(q);
    *i = q - *p * by_rows.divisor;
  }
};

// x: (P, H, W)  y, indices: (P, H_out, W_out); indices only for Max.
template <typename T, Kind kind>
__global__ void pool_forward_kernel(Pool2dShape s, PlaneIndex out, const T* x, T* y, int64_t* indices) {
  const int64_t total = s.planes * s.h_out * s.w_out;
  for (int64_t idx = first_index(); idx < total; idx += grid_stride()) {
    int64_t p, oi, oj;
    out.split(idx, &p, &oi, &oj);
    const T* plane = x + p * s.h * s.w;
    if constexpr (kind == Kind::Max) {
      T v = detail::max_window(s, plane, oi, oj, indices + idx);
      if (s.relu && v <= T(0)) {  // relu's gradient is 0 here: so is the window's
        v = T(0);
        indices[idx] = kNoWinnerIndex;
      }
      y[idx] = v;
    } else if constexpr (kind == Kind::Avg) {
      y[idx] = detail::avg_window(s, plane, oi, oj);
    } else {
      y[idx] = detail::adaptive_avg_window(s, plane, oi, oj);
    }
  }
}

// dy, indices: (P, H_out, W_out)  dx: (P, H, W); indices only for Max.
template <typename T, Kind kind>
__global__ void pool_backward_kernel(Pool2dShape s, PlaneIndex in, const T* dy, const int64_t* indices, T* dx) {
  const int64_t total = s.planes * s.h * s.w;
  for (int64_t idx = first_index(); idx < total; idx += grid_stride()) {
    int64_t p, i, j;
    in.split(idx, &p, &i, &j);
    const T* plane = dy + p * s.h_out * s.w_out;
    if constexpr (kind == Kind::Max) {
      dx[idx] = detail::max_backward_at(s, plane, indices + p * s.h_out * s.w_out, i, j);
    } else if constexpr (kind == Kind::Avg) {
      dx[idx] = detail::avg_backward_at(s, plane, i, j);
    } else {
      dx[idx] = detail::adaptive_avg_backward_at(s, plane, i, j);
    }
  }
}

// dy, indices: (P, H_out, W_out)  dx: (P, H, W), zeroed. Windows that do not overlap: each input is the winner
// of at most one output, so each dx element is written at most once (0 + dy: the gather's sum, -0 included).
// A window without a winner (kNoWinnerIndex, the relu's zeros) writes nothing.
template <typename T>
__global__ void max_pool_scatter_kernel(int64_t total, Divider by_plane, int64_t plane_in, const T* dy,
                                        const int64_t* indices, T* dx) {
  for (int64_t o = first_index(); o < total; o += grid_stride()) {
    const int64_t winner = indices[o];
    if (winner != kNoWinnerIndex) dx[by_plane.div(o) * plane_in + winner] = T(0) + dy[o];
  }
}

template <Kind kind>
void launch_forward(cudaStream_t stream, const char* what, const Pool2dShape& s, const void* x, void* y,
                    int64_t* indices) {
  const int64_t total = s.planes * s.h_out * s.w_out;
  if (total == 0) return;
  dispatch_compute_type(s.dtype, what, [&](auto tag) {
    using T = decltype(tag);
    pool_forward_kernel<T, kind><<<grid_for(total), kBlock, 0, stream>>>(
        s, PlaneIndex(total, s.h_out, s.w_out), static_cast<const T*>(x), static_cast<T*>(y), indices);
    DPE_CUDA_CHECK_LAUNCH();
  });
}

template <Kind kind>
void launch_backward(cudaStream_t stream, const char* what, const Pool2dShape& s, const void* dy,
                     const int64_t* indices, void* dx) {
  const int64_t total = s.planes * s.h * s.w;
  if (total == 0) return;
  dispatch_compute_type(s.dtype, what, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (kind == Kind::Max) {
      if (s.stride_h >= s.kh && s.stride_w >= s.kw) {
        DPE_CUDA_CHECK(cudaMemsetAsync(dx, 0, static_cast<size_t>(total) * sizeof(T), stream));
        const int64_t outputs = s.planes * s.h_out * s.w_out;
        if (outputs == 0) return;
        max_pool_scatter_kernel<T><<<grid_for(outputs), kBlock, 0, stream>>>(
            outputs, Divider(s.h_out * s.w_out, outputs), s.h * s.w, static_cast<const T*>(dy), indices,
            static_cast<T*>(dx));
        DPE_CUDA_CHECK_LAUNCH();
        return;
      }
    }
    pool_backward_kernel<T, kind><<<grid_for(total), kBlock, 0, stream>>>(
        s, PlaneIndex(total, s.h, s.w), static_cast<const T*>(dy), indices, static_cast<T*>(dx));
    DPE_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

// x: (P, H, W)  y, indices: (P, H_out, W_out)
void max_pool2d_cuda(cudaStream_t stream, const Pool2dShape& s, const void* x, void* y, int64_t* indices) {
  check_pool2d_shape("max_pool2d_cuda", s);
  launch_forward<Kind::Max>(stream, "max_pool2d_cuda", s, x, y, indices);
}

// dy, indices: (P, H_out, W_out)  dx: (P, H, W)
void max_pool2d_backward_cuda(cudaStream_t stream, const Pool2dShape& s, const void* dy, const int64_t* indices,
                              void* dx) {
  check_pool2d_shape("max_pool2d_backward_cuda", s);
  launch_backward<Kind::Max>(stream, "max_pool2d_backward_cuda", s, dy, indices, dx);
}

// x: (P, H, W)  y: (P, H_out, W_out)
void avg_pool2d_cuda(cudaStream_t stream, const Pool2dShape& s, const void* x, void* y) {
  check_pool2d_shape("avg_pool2d_cuda", s);
  launch_forward<Kind::Avg>(stream, "avg_pool2d_cuda", s, x, y, nullptr);
}

// dy: (P, H_out, W_out)  dx: (P, H, W)
void avg_pool2d_backward_cuda(cudaStream_t stream, const Pool2dShape& s, const void* dy, void* dx) {
  check_pool2d_shape("avg_pool2d_backward_cuda", s);
  launch_backward<Kind::Avg>(stream, "avg_pool2d_backward_cuda", s, dy, nullptr, dx);
}

// x: (P, H, W)  y: (P, H_out, W_out)
void adaptive_avg_pool2d_cuda(cudaStream_t stream, const Pool2dShape& s, const void* x, void* y) {
  check_adaptive_shape("adaptive_avg_pool2d_cuda", s);
  launch_forward<Kind::Adaptive>(stream, "adaptive_avg_pool2d_cuda", s, x, y, nullptr);
}

// dy: (P, H_out, W_out)  dx: (P, H, W)
void adaptive_avg_pool2d_backward_cuda(cudaStream_t stream, const Pool2dShape& s, const void* dy, void* dx) {
  check_adaptive_shape("adaptive_avg_pool2d_backward_cuda", s);
  launch_backward<Kind::Adaptive>(stream, "adaptive_avg_pool2d_backward_cuda", s, dy, nullptr, dx);
}

}  // namespace dpe::kernels
