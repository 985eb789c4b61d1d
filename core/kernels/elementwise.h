// Elementwise kernels. dtype is float32 or float64 (the tensor layer casts storage types first).
// Unless a Layout is given, operands are contiguous arrays of n elements; outputs may alias inputs.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/kernels/backend_types.h"
#include "core/kernels/layout.h"
#include "core/kernels/op_enums.h"

namespace dpe::kernels {

// y = f(x)
void unary_cpu(UnaryOp op, DType dtype, int64_t n, const void* x, void* y);
void unary_cuda(cudaStream_t stream, UnaryOp op, DType dtype, int64_t n, const void* x, void* y);

// dx = dy * f'(x)
void activation_backward_cpu(ActivationOp op, DType dtype, int64_t n, const void* x, const void* dy, void* dx);
void activation_backward_cuda(cudaStream_t stream, ActivationOp op, DType dtype, int64_t n, const void* x,
                              const void* dy, void* dx);

// SwiGLU's gating, one pass each way (core/ops.h's silu_mul): y = silu(gate) * up, and backward
// dgate = silu'(gate) * (dy * up),  dup = dy * silu(gate)  (dgate or dup null: not written). Element for element
// the roundings of the SiLU, mul and SiLU-backward kernels that the composition runs on the same backend.
// Outputs do not overlap inputs.
void silu_mul_cpu(DType dtype, int64_t n, const void* gate, const void* up, void* y);
void silu_mul_backward_cpu(DType dtype, int64_t n, const void* gate, const void* up, const void* dy, void* dgate,
                           void* dup);
void silu_mul_cuda(cudaStream_t stream, DType dtype, int64_t n, const void* gate, const void* up, void* y);
void silu_mul_backward_cuda(cudaStream_t stream, DType dtype, int64_t n, const void* gate, const void* up,
                            const void* dy, void* dgate, void* dup);

// out = a (op) b with broadcasting. out_layout is contiguous with the broadcast sizes; a_layout and
// b_layout have the same ndim and sizes as out, with stride 0 on broadcast dimensions.
void binary_cpu(BinaryOp op, DType dtype, const Layout& out_layout, const void* a, const Layout& a_layout,
                const void* b, const Layout& b_layout, void* out);
void binary_cuda(cudaStream_t stream, BinaryOp op, DType dtype, const Layout& out_layout, const void* a,
                 const Layout& a_layout, const void* b, const Layout& b_layout, void* out);

// y = alpha * x + beta  (scale, add-scalar, negate)
void affine_cpu(DType dtype, int64_t n, const void* x, double alpha, double beta, void* y);
void affine_cuda(cudaStream_t stream, DType dtype, int64_t n, const void* x, double alpha, double beta, void* y);

// y += alpha * x  (gradient accumulation, SGD)
void axpy_cpu(DType dtype, int64_t n, double alpha, const void* x, void* y);
void axpy_cuda(cudaStream_t stream, DType dtype, int64_t n, double alpha, const void* x, void* y);

}  // namespace dpe::kernels
