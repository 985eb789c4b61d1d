// Contract: allocate() returns nullptr when pinned memory runs out and throws on any other CUDA error.
// Blocks are portable (cudaHostAllocPortable): pinned for every GPU, not only the one current when allocated,
// so one batch can be scattered to all devices. Events record on the logical device's compute stream, the
// stream every copy to that device runs on (core/cuda/cuda_copy.cc).
#include "core/cuda/cuda_host_allocator.h"

#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_device.h"
#include "core/error.h"

namespace dpe::cuda {

namespace {

class CudaHostAllocatorBackend final : public HostAllocatorBackend {
 public:
  void* allocate(size_t nbytes) override {
    void* ptr = nullptr;
    cudaError_t status = cudaHostAlloc(&ptr, nbytes, cudaHostAllocPortable);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear it, so the next launch check does not report it
      return nullptr;
    }
    if (status != cudaSuccess) {
      std::string call = ::dpe::detail::str_cat("cudaHostAlloc(", nbytes, " bytes)");
      detail::throw_cuda_error(status, call.c_str(), __FILE__, __LINE__);
    }
    return ptr;
  }

  void deallocate(void* ptr) override { DPE_CUDA_CHECK(cudaFreeHost(ptr)); }

  Event record_event(int device) override {
    DeviceGuard guard(device);  // an event belongs to the device current when it is created
    cudaEvent_t event = nullptr;
    DPE_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    DPE_CUDA_CHECK(cudaEventRecord(event, stream(device)));
    return event;
  }

  bool query_event(Event event) override {
    cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (status == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    DPE_CUDA_CHECK(status);
    return true;
  }

  void destroy_event(Event event) override { DPE_CUDA_CHECK(cudaEventDestroy(static_cast<cudaEvent_t>(event))); }
};

}  // namespace

std::unique_ptr<HostAllocatorBackend> make_cuda_host_allocator_backend() {
  return std::make_unique<CudaHostAllocatorBackend>();
}

}  // namespace dpe::cuda
