// CUDA elementwise kernels (core/kernels/elementwise.h). The scalar math is core/kernels/math.h, shared
// with elementwise_cpu.cc; each op is a template argument, so math.h's switch folds away per kernel.
// Aliasing: an output may be the same array as an input (each element is read before it is written).
#include <cstdint>

#include "core/kernels/arg_checks.h"
#include "core/kernels/cuda_launch.cuh"
#include "core/kernels/elementwise.h"
#include "core/kernels/math.h"
#include "core/kernels/offset_calc.h"

namespace dpe::kernels {
namespace {

using detail::dispatch_compute_type;
using detail::dispatch_op;
using detail::first_index;
using detail::grid_for;
using detail::grid_stride;
using detail::kBlock;
using detail::check_n;
using detail::OffsetCalc32;

template <typename F>
void dispatch_unary(UnaryOp op, F&& f) {
  using enum UnaryOp;
  dispatch_op<Neg, Exp, Log, Sqrt, Rsqrt, Abs, Square, Reciprocal, Relu, Gelu, Silu, Tanh, Sigmoid>(op, f);
}

template <typename F>
void dispatch_activation(ActivationOp op, F&& f) {
  using enum ActivationOp;
  dispatch_op<Relu, Gelu, Silu, Tanh, Sigmoid>(op, f);
}

template <typename F>
void dispatch_binary(BinaryOp op, F&& f) {
  using enum BinaryOp;
  dispatch_op<Add, Sub, Mul, Div, Maximum, Minimum>(op, f);
}

// x, y: (n)
template <typename T, UnaryOp Op>
__global__ void unary_kernel(int64_t n, const T* x, T* y) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = apply_unary(Op, x[i]);
}

// x, dy, dx: (n)
template <typename T, ActivationOp Op>
__global__ void activation_backward_kernel(int64_t n, const T* x, const T* dy, T* dx) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dx[i] = activation_backward(Op, x[i], dy[i]);
}

// gate, up, y: (n)
template <typename T>
__global__ void silu_mul_kernel(int64_t n, const T* gate, const T* up, T* y) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = apply_unary(UnaryOp::Silu, gate[i]) * up[i];
}

// gate, up, dy, dgate, dup: (n); dgate or dup null: not written.
template <typename T>
__global__ void silu_mul_backward_kernel(int64_t n, const T* gate, const T* up, const T* dy, T* dgate, T* dup) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    if (dup != nullptr) dup[i] = dy[i] * apply_unary(UnaryOp::Silu, gate[i]);
    if (dgate != nullptr) dgate[i] = activation_backward(ActivationOp::Silu, gate[i], dy[i] * up[i]);
  }
}

// out: (n) contiguous  a: a_layout  b: b_layout (out's sizes, stride 0 broadcasts). A contiguous operand
// skips the index arithmetic.
template <typename T, BinaryOp Op>
__global__ void binary_kernel(int64_t n, const T* a, Layout a_layout, bool a_contiguous, const T* b,
                              Layout b_layout, bool b_contiguous, T* out) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const T av = a[a_contiguous ? i : a_layout.offset_of(i)];
    const T bv = b[b_contiguous ? i : b_layout.offset_of(i)];
    out[i] = apply_binary(Op, av, bv);
  }
}

// out: (n) contiguous, n < 2^31  a, b: offsets from `calc` (the coalesced layouts, core/kernels/offset_calc.h).
template <typename T, BinaryOp Op>
__global__ void binary_strided32_kernel(uint32_t n, const T* a, const T* b, OffsetCalc32<2> calc, T* out) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    uint32_t off[2];
    calc.offsets(i, off);
    out[i] = apply_binary(Op, a[off[0]], b[off[1]]);
  }
}

// One rounding (fma): what the CPU kernels get where the host compiler contracts a * x + b (GCC does by
// default in C++ on FMA hardware, at -O1 and above); where it does not, results differ by one rounding.
// x, y: (n). alpha and beta are rounded to T first, like affine_cpu.
template <typename T>
__global__ void affine_kernel(int64_t n, const T* x, T alpha, T beta, T* y) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = fma(alpha, x[i], beta);
}

// x, y: (n)
template <typename T>
__global__ void axpy_kernel(int64_t n, T alpha, const T* x, T* y) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = fma(alpha, x[i], y[i]);
}

}  // namespace

// x, y: (n)
void unary_cuda(cudaStream_t stream, UnaryOp op, DType dtype, int64_t n, const void* x, void* y) {
  check_n("unary_cuda", n);
  if (n == 0) return;
  dispatch_compute_type(dtype, "unary_cuda", [&](auto tag) {
    using T = decltype(tag);
    dispatch_unary(op, [&](auto op_c) {
      unary_kernel<T, decltype(op_c)::value><<<grid_for(n), kBlock, 0, stream>>>(n, static_cast<const T*>(x),
                                                                                 static_cast<T*>(y));
      DPE_CUDA_CHECK_LAUNCH();
    });
  });
}

void silu_mul_cuda(cudaStream_t stream, DType dtype, int64_t n, const void* gate, const void* up, void* y) {
  check_n("silu_mul_cuda", n);
  if (n == 0) return;
  dispatch_compute_type(dtype, "silu_mul_cuda", [&](auto tag) {
    using T = decltype(tag);
    silu_mul_kernel<T><<<grid_for(n), kBlock, 0, stream>>>(n, static_cast<const T*>(gate), static_cast<const T*>(up),
                                                           static_cast<T*>(y));
    DPE_CUDA_CHECK_LAUNCH();
  });
}

void silu_mul_backward_cuda(cudaStream_t stream, DType dtype, int64_t n, const void* gate, const void* up,
                            const void* dy, void* dgate, void* dup) {
  check_n("silu_mul_backward_cuda", n);
  if (n == 0 || (dgate == nullptr && dup == nullptr)) return;
  dispatch_compute_type(dtype, "silu_mul_backward_cuda", [&](auto tag) {
    using T = decltype(tag);
    silu_mul_backward_kernel<T><<<grid_for(n), kBlock, 0, stream>>>(
        n, static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<const T*>(dy), static_cast<T*>(dgate),
        static_cast<T*>(dup));
    DPE_CUDA_CHECK_LAUNCH();
  });
}

// x, dy, dx: (n)
void activation_backward_cuda(cudaStream_t stream, ActivationOp op, DType dtype, int64_t n, const void* x,
                              const void* dy, void* dx) {
  check_n("activation_backward_cuda", n);
  if (n == 0) return;
  dispatch_compute_type(dtype, "activation_backward_cuda", [&](auto tag) {
    using T = decltype(tag);
    dispatch_activation(op, [&](auto op_c) {
      activation_backward_kernel<T, decltype(op_c)::value><<<grid_for(n), kBlock, 0, stream>>>(
          n, static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx));
      DPE_CUDA_CHECK_LAUNCH();
    });
  });
}

// out: out_layout (contiguous)  a: a_layout  b: b_layout, all with out's sizes (stride 0 broadcasts).
void binary_cuda(cudaStream_t stream, BinaryOp op, DType dtype, const Layout& out_layout, const void* a,
                 const Layout& a_layout, const void* b, const Layout& b_layout, void* out) {
  detail::check_binary_layouts("binary_cuda", out_layout, a_layout, b_layout);
  const int64_t n = out_layout.numel();
  if (n == 0) return;
  const bool a_contiguous = a_layout.is_contiguous(), b_contiguous = b_layout.is_contiguous();
  OffsetCalc32<2> calc;
  const Layout* const operands[2] = {&a_layout, &b_layout};
  const bool strided32 = !(a_contiguous && b_contiguous) && detail::make_offset_calc32(operands, &calc);
  dispatch_compute_type(dtype, "binary_cuda", [&](auto tag) {
    using T = decltype(tag);
    dispatch_binary(op, [&](auto op_c) {
      if (strided32) {
        binary_strided32_kernel<T, decltype(op_c)::value><<<grid_for(n), kBlock, 0, stream>>>(
            static_cast<uint32_t>(n), static_cast<const T*>(a), static_cast<const T*>(b), calc, static_cast<T*>(out));
        DPE_CUDA_CHECK_LAUNCH();
        return;
      }
      binary_kernel<T, decltype(op_c)::value><<<grid_for(n), kBlock, 0, stream>>>(n, static_cast<const T*>(a), a_layout,
                                                                   a_contiguous, static_cast<const T*>(b),
                                                                   b_layout, b_contiguous, static_cast<T*>(out));
      DPE_CUDA_CHECK_LAUNCH();
    });
  });
}

// x, y: (n)
void affine_cuda(cudaStream_t stream, DType dtype, int64_t n, const void* x, double alpha, double beta, void* y) {
  check_n("affine_cuda", n);
  if (n == 0) return;
  dispatch_compute_type(dtype, "affine_cuda", [&](auto tag) {
    using T = decltype(tag);
    affine_kernel<T><<<grid_for(n), kBlock, 0, stream>>>(n, static_cast<const T*>(x), static_cast<T>(alpha),
                                                         static_cast<T>(beta), static_cast<T*>(y));
    DPE_CUDA_CHECK_LAUNCH();
  });
}

// x, y: (n)
void axpy_cuda(cudaStream_t stream, DType dtype, int64_t n, double alpha, const void* x, void* y) {
  check_n("axpy_cuda", n);
  if (n == 0) return;
  dispatch_compute_type(dtype, "axpy_cuda", [&](auto tag) {
    using T = decltype(tag);
    axpy_kernel<T><<<grid_for(n), kBlock, 0, stream>>>(n, static_cast<T>(alpha), static_cast<const T*>(x),
                                                       static_cast<T*>(y));
    DPE_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dpe::kernels
