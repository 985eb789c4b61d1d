// CUDA rotary embeddings (core/kernels/rotary_emb.h): one kernel each way, where the composition (narrow, neg,
// cat, two muls and an add) launched six forward and more backward. A thread per output element; every product
// is rounded before the add or subtract that uses it (__fmul_rn / __dmul_rn are never contracted into a fused
// multiply-add), so the results are rotary_emb_cpu.cc's bit for bit.
#include <cstdint>

#include "core/kernels/arg_checks.h"
#include "core/kernels/cuda_launch.cuh"
#include "core/kernels/rotary_emb.h"

namespace dpe::kernels {
namespace {

using detail::dispatch_compute_type;
using detail::first_index;
using detail::grid_for;
using detail::grid_stride;
using detail::kBlock;

__device__ __forceinline__ float product(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double product(double a, double b) { return __dmul_rn(a, b); }

// n elements of the (..., T, d) operand; element i is column j = i % d of row i / d, at position t = row % T.
// The forward reads x at strided's offsets and writes y[i]; the backward reads dy[i] (contiguous) and writes dx
// at strided's offsets. h = d / 2.
template <typename T, bool kBackward>
__global__ void rotary_kernel(int64_t n, Layout strided, const T* in, const T* cos, const T* sin, T* out) {
  const int64_t d = strided.sizes[strided.ndim - 1], h = d / 2, positions = strided.sizes[strided.ndim - 2];
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t row = i / d, j = i % d;
    const int64_t partner = j < h ? j + h : j - h;
    const T* c = cos + row % positions * d;
    const T* s = sin + row % positions * d;
    const int64_t row_at = strided.offset_of(row * d);  // the row's first element; its last stride is 1
    if constexpr (kBackward) {
      //   dx[j] = g[j] * c[j] + g[j + h] * s[j + h]   (j < h)
      //   dx[j] = g[j] * c[j] - g[j - h] * s[j - h]   (j >= h)
      const T own = product(in[i], c[j]), other = product(in[row * d + partner], s[partner]);
      out[row_at + j] = j < h ? own + other : own - other;
    } else {
      //   y[j] = x[j] * c[j] - x[j + h] * s[j]   (j < h)
      //   y[j] = x[j] * c[j] + x[j - h] * s[j]   (j >= h)
      const T own = product(in[row_at + j], c[j]), other = product(in[row_at + partner], s[j]);
      out[i] = j < h ? own - other : own + other;
    }
  }
}

template <bool kBackward>
void rotate(const char* what, cudaStream_t stream, DType dtype, const Layout& strided, const void* in,
            const void* cos, const void* sin, void* out) {
  detail::check_rotary_layout(what, strided);
  const int64_t n = strided.numel();
  if (n == 0) return;
  dispatch_compute_type(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    rotary_kernel<T, kBackward><<<grid_for(n), kBlock, 0, stream>>>(n, strided, static_cast<const T*>(in),
                                                                    static_cast<const T*>(cos),
                                                                    static_cast<const T*>(sin), static_cast<T*>(out));
    DPE_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void rotary_emb_forward_cuda(cudaStream_t stream, DType dtype, const Layout& x_layout, const void* x,
                             const void* cos, const void* sin, void* y) {
  rotate<false>("rotary_emb_forward_cuda", stream, dtype, x_layout, x, cos, sin, y);
}

void rotary_emb_backward_cuda(cudaStream_t stream, DType dtype, const Layout& dx_layout, const void* dy,
                              const void* cos, const void* sin, void* dx) {
  rotate<true>("rotary_emb_backward_cuda", stream, dtype, dx_layout, dy, cos, sin, dx);
}

}  // namespace dpe::kernels
