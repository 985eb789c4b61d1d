// Checked calls into the CUDA runtime, cuBLAS, cuDNN and NCCL: a failure throws dpe::Error with the
// library's own error string, the call's text and the source location. A failed allocation
// (cudaErrorMemoryAllocation, CUBLAS_STATUS_ALLOC_FAILED, cuDNN's allocation failures) is of kind
// ErrorKind::OutOfMemory, every other failure InvalidArgument. Include only from CUDA-enabled translation
// units (files under core/cuda/ or *.cu).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <nccl.h>

#include "core/error.h"

namespace dpe::cuda::detail {
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line);
[[noreturn]] void throw_cudnn_error(cudnnStatus_t status, const char* call, const char* file, int line);
[[noreturn]] void throw_nccl_error(ncclResult_t status, const char* call, const char* file, int line);
}  // namespace dpe::cuda::detail

#define DPE_CUDA_CHECK(call)                                                                         \
  do {                                                                                               \
    cudaError_t dpe_status_ = (call);                                                                \
    if (dpe_status_ != cudaSuccess) ::dpe::cuda::detail::throw_cuda_error(dpe_status_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: reports launch-configuration errors at the launch site.
#define DPE_CUDA_CHECK_LAUNCH() DPE_CUDA_CHECK(cudaGetLastError())

#define DPE_CUBLAS_CHECK(call)                                                                           \
  do {                                                                                                   \
    cublasStatus_t dpe_status_ = (call);                                                                 \
    if (dpe_status_ != CUBLAS_STATUS_SUCCESS) ::dpe::cuda::detail::throw_cublas_error(dpe_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define DPE_CUDNN_CHECK(call)                                                                          \
  do {                                                                                                 \
    cudnnStatus_t dpe_status_ = (call);                                                                \
    if (dpe_status_ != CUDNN_STATUS_SUCCESS) ::dpe::cuda::detail::throw_cudnn_error(dpe_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define DPE_NCCL_CHECK(call)                                                                         \
  do {                                                                                               \
    ncclResult_t dpe_status_ = (call);                                                               \
    if (dpe_status_ != ncclSuccess) ::dpe::cuda::detail::throw_nccl_error(dpe_status_, #call, __FILE__, __LINE__); \
  } while (0)
