// cudaMalloc/cudaFree backend of a logical CUDA device's caching allocator (core/allocator.h).
// Contract: allocate() returns nullptr when the GPU is out of memory (the caching layer then frees its cache,
// retries and reports the device), and throws on any other CUDA error. Blocks are allocated on the logical
// device's physical GPU; several logical devices on one GPU each keep their own accounting.
#include "core/cuda/cuda_allocator.h"

#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_device.h"
#include "core/error.h"

namespace dpe::cuda {

namespace {

class CudaBackendAllocator final : public BackendAllocator {
 public:
  explicit CudaBackendAllocator(int logical) : logical_(logical) {}

  void* allocate(size_t nbytes) override {
    DeviceGuard guard(logical_);
    void* ptr = nullptr;
    cudaError_t status = cudaMalloc(&ptr, nbytes);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear it, so the next launch check does not report it
      return nullptr;
    }
    if (status != cudaSuccess) {
      std::string call = ::dpe::detail::str_cat("cudaMalloc(", nbytes, " bytes) on cuda:", logical_);
      detail::throw_cuda_error(status, call.c_str(), __FILE__, __LINE__);
    }
    return ptr;
  }

  // cudaFree waits for the GPU's pending work, so a block is never freed under a running kernel.
  void deallocate(void* ptr) override {
    DeviceGuard guard(logical_);
    DPE_CUDA_CHECK(cudaFree(ptr));
  }

  // Used only to word the out-of-memory message: reports -1 rather than throwing on failure.
  int64_t free_bytes() const override {
    DeviceGuard guard(logical_);
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      cudaGetLastError();
      return -1;
    }
    return static_cast<int64_t>(free);
  }

 private:
  int logical_;
};

}  // namespace

std::unique_ptr<BackendAllocator> make_cuda_backend_allocator(int logical) {
  return std::make_unique<CudaBackendAllocator>(logical);
}

}  // namespace dpe::cuda
