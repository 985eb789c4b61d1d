// GEMM: the only matrix multiply in dpe. CPU: float32 on oneDNN (dnnl_sgemm by default, its matmul primitive
// or OpenBLAS by policy: core/kernels/sgemm_choice.h), bfloat16 operands on oneDNN's matmul primitive,
// OpenBLAS dgemm for float64 (gradient checks only). CUDA: cuBLAS (cublasGemmEx for 16-bit operands).
// Nothing here is hand-written.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/kernels/backend_types.h"

namespace dpe::kernels {

enum class Transpose : uint8_t { No, Yes };

// Row-major, batched: for b in [0, batch):
//   C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b]
// op(A[b]): (m, k)  op(B[b]): (k, n)  C[b]: (m, n).
// lda/ldb/ldc are row strides of the stored (untransposed) matrices; stride_a/b/c are batch strides in
// elements (0 broadcasts one matrix over the batch). beta == 0 ignores C's old contents (NaN included).
//
// Operand dtypes: float32 or float64 (C the same type), or the 16-bit floats of autocast (core/amp/autocast.h):
// A and B bfloat16 or float16, C float32, products accumulated in float32. CPU runs bfloat16 (oneDNN; at
// hardware speed where cpu_has_bf16_instructions(), emulated and slower than float32 on AVX-512 without them,
// an error below AVX-512) but not float16 (oneDNN 2.6 has no CPU f16 matmul: an error); CUDA runs both (no TF32
// anywhere).
struct GemmArgs {
  DType dtype = DType::Float32;  // of A and B: float32, float64, bfloat16 or float16
  Transpose trans_a = Transpose::No;
  Transpose trans_b = Transpose::No;
  int64_t m = 0, n = 0, k = 0;
  double alpha = 1.0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  double beta = 0.0;
  void* c = nullptr;
  int64_t ldc = 0;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

void gemm_cpu(const GemmArgs& args);
// gemm_cpu on the calling thread alone (its OpenMP setting 1 while it runs, so oneDNN starts no team): for
// kernels that call it from their own parallel tasks (kernels/attention.h), whatever the product's size.
void gemm_cpu_one_thread(const GemmArgs& args);

// Generates the kernels of gemm_cpu's float32 default (dnnl_sgemm) now, once per process (later calls return at
// once): dnnl_sgemm generates all of them on its first call, ~6 MB of JIT code, and doing that while another
// device's worker allocates its activations is how a run close to its address-space limit could still die in
// oneDNN's JIT (Note [Exceptions and oneDNN] in onednn_cpu.cc, measure 3). For a moment when no other thread
// computes: DeviceWorkerPool calls it before it starts CPU workers. Runs one 8x8x8 dnnl_sgemm on the calling
// thread with one OpenMP thread; where that fails (its address-space check or oneDNN), leaves the kernels to
// the first product, which checks again. Never throws.
void prepare_cpu_gemm() noexcept;

namespace detail {
// 2 m n k: the FLOPs of one matrix of `args` (its batch not counted).
inline double matrix_flops(const GemmArgs& args) {
  return 2.0 * static_cast<double>(args.m) * static_cast<double>(args.n) * static_cast<double>(args.k);
}
// The OpenMP threads gemm_cpu runs a call on: 1 when its products (every batch entry) add up to less than its
// threshold (Note [Small GEMMs on one thread] in matmul_cpu.cc), else the calling thread's omp_get_max_threads()
// (a batch of matrices each under the threshold: that many threads of the caller's TBB arena, a whole matrix on
// one at a time, Note [Small matrices of a batch in parallel]).
int gemm_threads(const GemmArgs& args);
}  // namespace detail
// Whether oneDNN runs bfloat16 products with this CPU's own instructions (avx512_core_bf16 or better, as
// limited by DPE_MAX_CPU_ISA and ONEDNN_MAX_CPU_ISA: Note [The CPU instruction-set cap], core/cpu_isa.h): the
// condition for CPU autocast to be worth it. Decided once per process.
bool cpu_has_bf16_instructions();
// `handle` is bound to `stream` by the caller.
void gemm_cuda(cudaStream_t stream, cublasHandle_t handle, const GemmArgs& args);

}  // namespace dpe::kernels
