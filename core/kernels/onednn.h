// Calling oneDNN without letting its failures end the process (Note [Exceptions and oneDNN] in
// onednn_cpu.cc). Every call into oneDNN (conv_cpu.cc's primitives, matmul_cpu.cc's dnnl_sgemm) runs inside
//
//   try { ...oneDNN calls... } catch (...) { detail::rethrow_onednn_failure("conv2d_forward_cpu", context); }
//
// which turns whatever escaped (dnnl::error, std::bad_alloc from oneDNN's own allocations, anything else)
// into a dpe::Error "<what>: <kind of failure> <context>", out of memory named as such. A dpe::Error thrown
// by dpe code inside the try (a scratchpad dpe could not allocate) passes through unchanged.
#pragma once

#include <string>

#include "core/kernels/matmul.h"

namespace dpe::kernels::detail {

// Call only from a catch block: rethrows the current exception as a dpe::Error.
[[noreturn]] void rethrow_onednn_failure(const char* what, const std::string& context);

// oneDNN's matmul primitive (onednn_matmul_cpu.cc): C (float32) = alpha * op(A) @ op(B) + beta * C for one
// matrix of `g` (its batch fields are ignored), A and B of g.dtype: float32 or bfloat16 (float32
// accumulation). Arguments already checked by gemm_cpu.
void onednn_matmul(const GemmArgs& g, const void* a, const void* b, float* c);

}  // namespace dpe::kernels::detail
