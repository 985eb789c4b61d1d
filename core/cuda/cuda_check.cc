// The throwing half of core/cuda/cuda_check.h. Messages read
//   "<call> failed: <library error name>: <library error string> (<file>:<line>)".
#include "core/cuda/cuda_check.h"

#include <string>

namespace dpe::cuda::detail {

namespace {

// cuDNN 9 names the allocation it could not make (host or device); earlier versions have one status for both.
bool is_cudnn_allocation_failure(cudnnStatus_t status) {
#if CUDNN_MAJOR >= 9
  return status == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
         status == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED;
#else
  return status == CUDNN_STATUS_ALLOC_FAILED;
#endif
}

}  // namespace

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  // Clear the runtime's last-error slot (non-sticky errors only), so that a failure the caller catches
  // does not resurface at the next DPE_CUDA_CHECK_LAUNCH() on this thread.
  cudaGetLastError();
  ::dpe::detail::throw_error(file, line, ::dpe::detail::str_cat(call, " failed: ", cudaGetErrorName(status), ": ",
                                                                cudaGetErrorString(status)),
                             status == cudaErrorMemoryAllocation ? ErrorKind::OutOfMemory : ErrorKind::InvalidArgument);
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  ::dpe::detail::throw_error(file, line, ::dpe::detail::str_cat(call, " failed: ", cublasGetStatusName(status),
                                                                ": ", cublasGetStatusString(status)),
                             status == CUBLAS_STATUS_ALLOC_FAILED ? ErrorKind::OutOfMemory : ErrorKind::InvalidArgument);
}

void throw_cudnn_error(cudnnStatus_t status, const char* call, const char* file, int line) {
  ::dpe::detail::throw_error(file, line, ::dpe::detail::str_cat(call, " failed: ", cudnnGetErrorString(status)),
                             is_cudnn_allocation_failure(status) ? ErrorKind::OutOfMemory : ErrorKind::InvalidArgument);
}

void throw_nccl_error(ncclResult_t status, const char* call, const char* file, int line) {
  // ncclGetLastError(nullptr) holds NCCL's detailed message for this thread's last failure, if any.
  const char* detail = ncclGetLastError(nullptr);
  std::string extra = (detail != nullptr && *detail != '\0') ? ::dpe::detail::str_cat(" (", detail, ")") : "";
  ::dpe::detail::throw_error(file, line,
                             ::dpe::detail::str_cat(call, " failed: ", ncclGetErrorString(status), extra));
}

}  // namespace dpe::cuda::detail
