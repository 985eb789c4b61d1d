// Calling oneDNN without letting its failures end the process (Note [Exceptions and oneDNN] in
// onednn_cpu.cc). Every call into oneDNN (conv_cpu.cc's primitives, matmul_cpu.cc's dnnl_sgemm) runs inside
//
//   try { ...oneDNN calls... } catch (...) { detail::rethrow_onednn_failure("conv2d_forward_cpu", context); }
//
// which turns whatever escaped (dnnl::error, std::bad_alloc from oneDNN's own allocations, anything else)
// into a dpe::Error "<what>: <kind of failure> <context>", out of memory named as such. A dpe::Error thrown
// by dpe code inside the try (a scratchpad dpe could not allocate) passes through unchanged.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstddef>
#include <string>

#include "core/kernels/matmul.h"

namespace dpe::kernels::detail {

// Applies DPE_MAX_CPU_ISA to oneDNN (Note [The CPU instruction-set cap], core/cpu_isa.h), once per process;
// throws when oneDNN was used before dpe and runs above the cap. Every first call into oneDNN goes through it:
// onednn_cpu_engine() (primitives), check_space_for_onednn_build (dnnl_sgemm's first call of each variant),
// cpu_has_bf16_instructions().
void apply_cpu_isa_cap_to_onednn();

// The CPU engine every oneDNN primitive of dpe's runs on. Created at the first call, never destroyed.
dnnl::engine& onednn_cpu_engine();

// Call only from a catch block: rethrows the current exception as a dpe::Error.
[[noreturn]] void rethrow_onednn_failure(const char* what, const std::string& context);

// Call right before oneDNN generates kernels (building a primitive, a dnnl_sgemm variant's first call): throws
// a dpe::Error "<what>: out of memory ..." naming `context` when kOneDnnBuildReserve of address space cannot be
// reserved, so that oneDNN does not start so close to the limit that it fails where it cannot report it (Note
// [Exceptions and oneDNN] in onednn_cpu.cc). Reserves nothing that stays: the space is mapped without access
// and released at once. Cheap (one mmap and munmap), and builds are cached: it runs once per shape.
void check_space_for_onednn_build(const char* what, const std::string& context);
inline constexpr size_t kOneDnnBuildReserve = size_t{16} << 20;

// oneDNN's matmul primitive (onednn_matmul_cpu.cc): C (float32) = alpha * op(A) @ op(B) + beta * C for one
// matrix of `g` (its batch fields are ignored), A and B of g.dtype: float32 or bfloat16 (float32
// accumulation). Arguments already checked by gemm_cpu.
void onednn_matmul(const GemmArgs& g, const void* a, const void* b, float* c);
// How many matmul primitives are cached now (tests; at most kPrimitiveCacheCapacity).
size_t onednn_matmul_primitives_cached();
// How many convolution primitives are cached now (tests; at most kPrimitiveCacheCapacity).
size_t onednn_conv_primitives_cached();

}  // namespace dpe::kernels::detail
