// CUDA GEMM via cuBLAS (core/kernels/matmul.h).
//
// Note [row-major GEMM on column-major cuBLAS]
// A row-major matrix with row stride ld is, read column-major with leading dimension ld, its transpose.
// So the row-major C = op(A) op(B), i.e. the column-major C^T = op(B)^T op(A)^T, is one cuBLAS call with
// the operands swapped: (m, n) -> (n, m), B first with B's transpose flag, then A with A's, and each ld
// unchanged. Batch strides carry over as they are (0 broadcasts one matrix over the batch).
//
// 16-bit operands (autocast): cublasGemmStridedBatchedEx with A and B in CUDA_R_16BF / CUDA_R_16F, C in
// CUDA_R_32F and CUBLAS_COMPUTE_32F (float32 accumulation, as PyTorch's autocast matmuls accumulate).
//
// Float32 uses cuBLAS's default math mode (true FP32, no TF32), so results are comparable with the CPU's
// sgemm to k * eps. Determinism: cuBLAS gives bit-identical results run to run on one GPU model with one
// stream per handle, which is how dpe uses it (core/cuda/cuda_device.h).
#include <cstdint>

#include "core/kernels/arg_checks.h"
#include "core/kernels/cuda_launch.cuh"
#include "core/kernels/matmul.h"

namespace dpe::kernels {
namespace {

using detail::dispatch_compute_type;
using detail::first_index;
using detail::grid_for;
using detail::grid_stride;
using detail::kBlock;

cublasOperation_t to_cublas(Transpose t) { return t == Transpose::Yes ? CUBLAS_OP_T : CUBLAS_OP_N; }

// C[b]: (m, n) with row stride ldc, batch stride stride_c.  C = beta * C, and C = 0 when beta == 0 (NaN
// included): the k == 0 or alpha == 0 case, where there is no product to add and neither A nor B is read
// (BLAS semantics, as in gemm_cpu).
template <typename T>
__global__ void scale_c_kernel(int64_t batch, int64_t m, int64_t n, T beta, T* c, int64_t ldc, int64_t stride_c) {
  const int64_t total = batch * m * n;
  for (int64_t idx = first_index(); idx < total; idx += grid_stride()) {
    const int64_t b = idx / (m * n), i = idx / n % m, j = idx % n;
    T& v = c[b * stride_c + i * ldc + j];
    v = beta == T(0) ? T(0) : beta * v;
  }
}

template <typename T>
void scale_c(cudaStream_t stream, const GemmArgs& g, T beta) {
  if (beta == T(1)) return;  // C unchanged
  const int64_t total = g.batch * g.m * g.n;
  scale_c_kernel<T><<<grid_for(total), kBlock, 0, stream>>>(g.batch, g.m, g.n, beta, static_cast<T*>(g.c), g.ldc,
                                                           g.stride_c);
  DPE_CUDA_CHECK_LAUNCH();
}

// The column-major call of Note [row-major GEMM on column-major cuBLAS].
void gemm_strided_batched(cublasHandle_t handle, const GemmArgs& g, const float* alpha, const float* beta) {
  DPE_CUBLAS_CHECK(cublasSgemmStridedBatched_64(
      handle, to_cublas(g.trans_b), to_cublas(g.trans_a), g.n, g.m, g.k, alpha, static_cast<const float*>(g.b),
      g.ldb, g.stride_b, static_cast<const float*>(g.a), g.lda, g.stride_a, beta, static_cast<float*>(g.c), g.ldc,
      g.stride_c, g.batch));
}

void gemm_strided_batched(cublasHandle_t handle, const GemmArgs& g, const double* alpha, const double* beta) {
  DPE_CUBLAS_CHECK(cublasDgemmStridedBatched_64(
      handle, to_cublas(g.trans_b), to_cublas(g.trans_a), g.n, g.m, g.k, alpha, static_cast<const double*>(g.b),
      g.ldb, g.stride_b, static_cast<const double*>(g.a), g.lda, g.stride_a, beta, static_cast<double*>(g.c),
      g.ldc, g.stride_c, g.batch));
}

// A and B bfloat16 or float16, C float32 (matmul.h's operand dtypes).
void gemm_strided_batched_16bit(cublasHandle_t handle, const GemmArgs& g) {
  const cudaDataType operands = g.dtype == DType::BFloat16 ? CUDA_R_16BF : CUDA_R_16F;
  const float alpha = static_cast<float>(g.alpha), beta = static_cast<float>(g.beta);
  DPE_CUBLAS_CHECK(cublasGemmStridedBatchedEx_64(handle, to_cublas(g.trans_b), to_cublas(g.trans_a), g.n, g.m, g.k,
                                                 &alpha, g.b, operands, g.ldb, g.stride_b, g.a, operands, g.lda,
                                                 g.stride_a, &beta, g.c, CUDA_R_32F, g.ldc, g.stride_c, g.batch,
                                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

// A[b]: (m, k), or (k, m) if trans_a  B[b]: (k, n), or (n, k) if trans_b  C[b]: (m, n); b < batch.
void gemm_cuda(cudaStream_t stream, cublasHandle_t handle, const GemmArgs& args) {
  detail::check_gemm_args("gemm_cuda", args);  // the same checks and words as gemm_cpu
  if (args.m == 0 || args.n == 0 || args.batch == 0) return;
  cudaStream_t bound = nullptr;
  DPE_CUBLAS_CHECK(cublasGetStream(handle, &bound));
  DPE_INTERNAL_ASSERT(bound == stream, "gemm_cuda: the cuBLAS handle is bound to another stream");
  const bool no_product = args.k == 0 || args.alpha == 0.0;
  if (args.dtype == DType::BFloat16 || args.dtype == DType::Float16) {
    if (no_product) return scale_c(stream, args, static_cast<float>(args.beta));  // C is float32
    return gemm_strided_batched_16bit(handle, args);
  }
  dispatch_compute_type(args.dtype, "gemm_cuda", [&](auto tag) {
    using T = decltype(tag);
    const T alpha = static_cast<T>(args.alpha), beta = static_cast<T>(args.beta);
    if (no_product) return scale_c(stream, args, beta);
    gemm_strided_batched(handle, args, &alpha, &beta);
  });
}

}  // namespace dpe::kernels
