// The CUDA runtime layer: device count without a GPU (runs everywhere), and with a GPU (skipped without
// one): streams and cuBLAS handles, logical devices sharing a GPU, the allocator's out-of-memory message,
// and host/device copies between logical devices with their stream ordering.
//
// With a GPU this binary maps logical devices {0, 0} (plus physical GPU 1 when present) before any test
// runs (LogicalDeviceEnvironment), so every test sees two logical devices on GPU 0.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/error.h"

#if DPE_WITH_CUDA
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_copy.h"
#include "core/cuda/cuda_device.h"
#endif

namespace dpe {
namespace {

// gmock is not available (Debian's libgtest only), so a substring check by hand.
#define EXPECT_CONTAINS(text, needle)                                                     \
  do {                                                                                    \
    const std::string text_ = (text), needle_ = (needle);                                 \
    EXPECT_NE(text_.find(needle_), std::string::npos) << "'" << text_ << "'\n does not contain '" << needle_ << "'"; \
  } while (0)

// The message of the dpe::Error that f throws (fails the test if it throws nothing).
template <typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a dpe::Error";
  return "";
}

TEST(CudaRuntimeNoGpu, NoDeviceMeansZeroDevicesAndClearErrors) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present; this test covers machines without one";
  EXPECT_EQ(cuda_device_count(), 0);
  EXPECT_FALSE(cuda_available());
  EXPECT_TRUE(all_devices(DeviceKind::CUDA).empty());
  std::string message = error_message([] { check_device_exists(Device::cuda(0)); });
  EXPECT_CONTAINS(message, "cuda:0 does not exist");
  EXPECT_CONTAINS(error_message([] { allocator_for(Device::cuda(0)); }), "cuda:0");
#if DPE_WITH_CUDA
  EXPECT_CONTAINS(message, "no CUDA device is visible");
  EXPECT_EQ(cuda::physical_device_count(), 0);
  const std::string reason = cuda::unavailable_reason();
  EXPECT_FALSE(reason.empty());
  EXPECT_CONTAINS(message, reason);  // the driver's own words reach the user
  EXPECT_CONTAINS(error_message([] { cuda::stream(0); }), "logical CUDA device 0 does not exist");
  message = error_message([] { set_cuda_logical_devices({0}); });
  EXPECT_CONTAINS(message, "physical GPU 0");
  EXPECT_CONTAINS(message, reason);
  EXPECT_CONTAINS(error_message([] { set_cuda_logical_devices({}); }), "empty");
  // (No cudaGetLastError() check here: without a driver every runtime call, that one included, returns the
  // initialisation error again; nothing will be launched on such a machine anyway.)
#else
  EXPECT_CONTAINS(message, "no CUDA support");
  EXPECT_CONTAINS(error_message([] { set_cuda_logical_devices({0}); }), "no CUDA support");
#endif
}

#if DPE_WITH_CUDA

// A failed allocation inside the CUDA libraries is of kind OutOfMemory, whatever its text (a failure policy
// asks the kind); their other failures are not. Needs no GPU: only the error is built.
TEST(CudaCheck, AllocationFailuresAreOfKindOutOfMemory) {
  const auto kind_of = [](auto&& f) -> std::optional<ErrorKind> {
    try {
      f();
    } catch (const Error& e) {
      return e.kind();
    }
    return std::nullopt;
  };
  EXPECT_EQ(kind_of([] { DPE_CUDA_CHECK(cudaErrorMemoryAllocation); }), ErrorKind::OutOfMemory);
  EXPECT_EQ(kind_of([] { DPE_CUDA_CHECK(cudaErrorInvalidValue); }), ErrorKind::InvalidArgument);
  EXPECT_EQ(kind_of([] { DPE_CUBLAS_CHECK(CUBLAS_STATUS_ALLOC_FAILED); }), ErrorKind::OutOfMemory);
  EXPECT_EQ(kind_of([] { DPE_CUBLAS_CHECK(CUBLAS_STATUS_INVALID_VALUE); }), ErrorKind::InvalidArgument);
#if CUDNN_MAJOR >= 9
  EXPECT_EQ(kind_of([] { DPE_CUDNN_CHECK(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED); }),
            ErrorKind::OutOfMemory);
  EXPECT_EQ(kind_of([] { DPE_CUDNN_CHECK(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED); }),
            ErrorKind::OutOfMemory);
#endif
  EXPECT_EQ(kind_of([] { DPE_CUDNN_CHECK(CUDNN_STATUS_BAD_PARAM); }), ErrorKind::InvalidArgument);
}

// Two logical devices on GPU 0 (and a third on GPU 1 if there is one), set before anything uses a device.
class LogicalDeviceEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    int physical = cuda::physical_device_count();
    if (physical == 0) return;
    std::vector<int> mapping = {0, 0};
    if (physical >= 2) mapping.push_back(1);
    set_cuda_logical_devices(mapping);
  }
};
[[maybe_unused]] const auto* const kEnvironment = ::testing::AddGlobalTestEnvironment(new LogicalDeviceEnvironment);

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason()

TEST(CudaRuntime, BadOrdinalsAreRejectedWithTheRange) {
  SKIP_WITHOUT_GPU();
  int physical = cuda::physical_device_count();
  std::string message = error_message([&] { cuda::set_logical_devices({0, physical}); });
  EXPECT_CONTAINS(message, "physical GPU " + std::to_string(physical));
  EXPECT_CONTAINS(message, "(0.." + std::to_string(physical - 1) + ")");
  EXPECT_CONTAINS(error_message([] { cuda::set_logical_devices({-1}); }), "physical GPU -1");
  int logical = cuda_device_count();
  message = error_message([&] { cuda::stream(logical); });
  EXPECT_CONTAINS(message, "logical CUDA device " + std::to_string(logical));
  EXPECT_CONTAINS(message, "(0.." + std::to_string(logical - 1) + ")");
}

TEST(CudaRuntime, LogicalDevicesShareOneGpuWithTheirOwnStreams) {
  SKIP_WITHOUT_GPU();
  ASSERT_GE(cuda_device_count(), 2);
  EXPECT_EQ(cuda::physical_device(0), 0);
  EXPECT_EQ(cuda::physical_device(1), 0);
  EXPECT_NE(cuda::stream(0), cuda::stream(1));
  EXPECT_EQ(cuda::stream(0), cuda::stream(0));  // created once
  EXPECT_NE(cuda::cublas_handle(0), cuda::cublas_handle(1));
  for (int d = 0; d < cuda_device_count(); ++d) {
    cudaStream_t bound = nullptr;
    DPE_CUBLAS_CHECK(cublasGetStream(cuda::cublas_handle(d), &bound));
    EXPECT_EQ(bound, cuda::stream(d)) << "cuda:" << d;
    cuda::synchronize(d);
  }
  // The mapping is frozen once devices are in use.
  EXPECT_CONTAINS(error_message([] { set_cuda_logical_devices({0}); }), "before any CUDA device is used");
}

TEST(CudaRuntime, ResourcesAreCreatedOnceUnderConcurrency) {
  SKIP_WITHOUT_GPU();
  const int devices = cuda_device_count();
  std::vector<std::thread> threads;
  std::vector<std::vector<cudaStream_t>> streams(8);
  std::vector<std::vector<cublasHandle_t>> handles(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int d = devices - 1; d >= 0; --d) {
        streams[t].push_back(cuda::stream(d));
        handles[t].push_back(cuda::cublas_handle(d));
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 1; t < 8; ++t) {
    EXPECT_EQ(streams[t], streams[0]);
    EXPECT_EQ(handles[t], handles[0]);
  }
}

TEST(CudaRuntime, DeviceGuardRestoresTheCurrentDevice) {
  SKIP_WITHOUT_GPU();
  DPE_CUDA_CHECK(cudaSetDevice(0));
  const int last = cuda_device_count() - 1;
  {
    cuda::DeviceGuard guard(last);
    int current = -1;
    DPE_CUDA_CHECK(cudaGetDevice(&current));
    EXPECT_EQ(current, cuda::physical_device(last));
  }
  int current = -1;
  DPE_CUDA_CHECK(cudaGetDevice(&current));
  EXPECT_EQ(current, 0);
}

TEST(CudaRuntime, OutOfMemoryNamesTheDeviceAndLeavesNoStickyError) {
  SKIP_WITHOUT_GPU();
  CachingAllocator& allocator = allocator_for(Device::cuda(1));
  std::string message = error_message([&] { allocator.allocate(size_t(1) << 50); });
  EXPECT_CONTAINS(message, "out of memory on cuda:1");
  EXPECT_CONTAINS(message, "bytes free on the device");
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  void* ptr = allocator.allocate(4096);  // the device still works
  EXPECT_NE(ptr, nullptr);
  allocator.deallocate(ptr, 4096);
}

// Copies a pattern host -> cuda:0 -> every other logical device -> back to cuda:0 -> host, byte-exact.
TEST(CudaRuntime, RoundTripsBetweenLogicalDevices) {
  SKIP_WITHOUT_GPU();
  const int devices = cuda_device_count();
  const size_t nbytes = (size_t(1) << 22) + 3;  // odd size: no alignment assumptions
  std::vector<unsigned char> host(nbytes), back(nbytes, 0);
  for (size_t i = 0; i < nbytes; ++i) host[i] = static_cast<unsigned char>(i * 2654435761u >> 13);
  std::vector<void*> buffers;
  for (int d = 0; d < devices; ++d) buffers.push_back(allocator_for(Device::cuda(d)).allocate(nbytes));
  void* extra = allocator_for(Device::cuda(0)).allocate(nbytes);

  cuda::copy_host_to_device(0, buffers[0], host.data(), nbytes);
  for (int d = 1; d < devices; ++d) cuda::copy_device_to_device(d, buffers[d], d - 1, buffers[d - 1], nbytes);
  cuda::copy_device_to_device(0, extra, devices - 1, buffers[devices - 1], nbytes);
  cuda::copy_device_to_device(0, buffers[0], 0, extra, nbytes);  // same logical device
  cuda::copy_device_to_host(back.data(), 0, buffers[0], nbytes);
  EXPECT_EQ(std::memcmp(host.data(), back.data(), nbytes), 0);

  // Zero-byte copies are no-ops, even with null pointers.
  cuda::copy_host_to_device(0, nullptr, nullptr, 0);
  cuda::copy_device_to_host(nullptr, 0, nullptr, 0);
  cuda::copy_device_to_device(1, nullptr, 0, nullptr, 0);

  for (int d = 0; d < devices; ++d) allocator_for(Device::cuda(d)).deallocate(buffers[d], nbytes);
  allocator_for(Device::cuda(0)).deallocate(extra, nbytes);
}

// A device-to-device copy runs after work already enqueued on the source stream, without a host sync:
// a long memset on cuda:0's stream, then the source is set and copied to cuda:1 at once.
TEST(CudaRuntime, DeviceToDeviceCopyWaitsForTheSourceStream) {
  SKIP_WITHOUT_GPU();
  const size_t big = size_t(512) << 20, nbytes = size_t(1) << 20;
  void* busy = allocator_for(Device::cuda(0)).allocate(big);
  void* src = allocator_for(Device::cuda(0)).allocate(nbytes);
  void* dst = allocator_for(Device::cuda(1)).allocate(nbytes);
  {
    cuda::DeviceGuard guard(0);
    DPE_CUDA_CHECK(cudaMemsetAsync(src, 0, nbytes, cuda::stream(0)));
  }
  cuda::synchronize(0);
  for (int round = 1; round <= 3; ++round) {
    {
      cuda::DeviceGuard guard(0);
      for (int i = 0; i < 8; ++i) DPE_CUDA_CHECK(cudaMemsetAsync(busy, i, big, cuda::stream(0)));
      DPE_CUDA_CHECK(cudaMemsetAsync(src, 0x40 + round, nbytes, cuda::stream(0)));
    }
    cuda::copy_device_to_device(1, dst, 0, src, nbytes);
    std::vector<unsigned char> back(nbytes);
    cuda::copy_device_to_host(back.data(), 1, dst, nbytes);
    EXPECT_EQ(back.front(), 0x40 + round);
    EXPECT_EQ(back.back(), 0x40 + round);
  }
  allocator_for(Device::cuda(0)).deallocate(busy, big);
  allocator_for(Device::cuda(0)).deallocate(src, nbytes);
  allocator_for(Device::cuda(1)).deallocate(dst, nbytes);
}

TEST(CudaRuntime, CheckedCallsNameTheCallAndTheError) {
  SKIP_WITHOUT_GPU();
  std::string message = error_message([] { DPE_CUDA_CHECK(cudaSetDevice(1 << 20)); });
  EXPECT_CONTAINS(message, "cudaSetDevice(1 << 20) failed: cudaErrorInvalidDevice");
  EXPECT_CONTAINS(message, "cuda_runtime_test.cc:");
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  message = error_message([] {
    float one = 1;
    DPE_CUBLAS_CHECK(cublasSgemm(cuda::cublas_handle(0), CUBLAS_OP_N, CUBLAS_OP_N, -1, 1, 1, &one, nullptr, 1,
                                 nullptr, 1, &one, nullptr, 1));
  });
  EXPECT_CONTAINS(message, "failed: CUBLAS_STATUS_INVALID_VALUE");
}

#endif  // DPE_WITH_CUDA

}  // namespace
}  // namespace dpe
