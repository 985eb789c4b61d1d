// amp_unscale_cuda against amp_unscale_cpu: the same random gradients (some with inf or NaN planted), the
// same inv_scale; the unscaled values must be bit-identical (one correctly rounded multiply on both sides)
// and the flags equal. Skips (reported as skipped) without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/kernels/amp.h"
#include "tests/testing/kernel_test_util.h"

#if DPE_WITH_CUDA
#include "core/cuda/cuda_copy.h"
#include "core/cuda/cuda_device.h"
#endif

namespace dpe::kernels {
namespace {

#if !DPE_WITH_CUDA

TEST(AmpParity, NeedsCuda) { GTEST_SKIP() << "this dpe build has no CUDA support"; }

#else

constexpr int kDevice = 0;  // cuda:0

// Device memory of cuda:0 from its caching allocator, returned on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t nbytes)
      : nbytes_(std::max<size_t>(nbytes, 1)), ptr_(allocator_for(Device::cuda(kDevice)).allocate(nbytes_)) {}
  ~DeviceBuffer() { allocator_for(Device::cuda(kDevice)).deallocate(ptr_, nbytes_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }

 private:
  size_t nbytes_;
  void* ptr_;
};

template <typename T>
class AmpParity : public ::testing::Test {};
TYPED_TEST_SUITE(AmpParity, FloatTypes);

TYPED_TEST(AmpParity, UnscaleAndFoundInfMatchTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
  using T = TypeParam;
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  // Planted at the last element (the grid-stride loop's tail) or nowhere; 1<<20 + 3 spans several grid strides.
  struct Case {
    const char* name;
    bool plant;
    T value;
  };
  const Case cases[] = {{"clean", false, T(0)}, {"+inf", true, inf}, {"-inf", true, -inf}, {"nan", true, nan},
                        {"max", true, std::numeric_limits<T>::max()}};
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1023}, (int64_t{1} << 20) + 3}) {
    for (const Case& c : cases) {
      std::vector<T> g = random_vector<T, std::mt19937_64>(n, -1e3, 1e3, static_cast<uint64_t>(n) + 21);
      if (c.plant && n > 0) g[n - 1] = c.value;
      const size_t bytes = g.size() * sizeof(T);
      DeviceBuffer d_g(bytes), d_found(sizeof(float));
      const float zero = 0.0f;
      if (n > 0) cuda::copy_host_to_device(kDevice, d_g.get(), g.data(), bytes);
      cuda::copy_host_to_device(kDevice, d_found.get(), &zero, sizeof(float));
      const float inv_scale = static_cast<float>(1.0 / 3.0);  // not a power of two: rounding is compared too
      amp_unscale_cuda(cuda::stream(kDevice), dtype_of<T>(), n, d_g.get(), inv_scale, static_cast<float*>(d_found.get()));
      float cpu_found = 0.0f;
      amp_unscale_cpu(dtype_of<T>(), n, g.data(), inv_scale, &cpu_found);

      std::vector<T> gpu(g.size());
      float gpu_found = -1.0f;
      if (n > 0) cuda::copy_device_to_host(gpu.data(), kDevice, d_g.get(), bytes);  // waits for the stream
      cuda::copy_device_to_host(&gpu_found, kDevice, d_found.get(), sizeof(float));
      const std::string what = std::string(c.name) + " n=" + std::to_string(n);
      EXPECT_EQ(gpu_found, cpu_found) << what;
      EXPECT_EQ(cpu_found, (c.plant && n > 0 && !std::isfinite(c.value)) ? 1.0f : 0.0f) << what;
      int64_t mismatches = 0;
      for (int64_t i = 0; i < n; ++i) {
        const bool same = gpu[i] == g[i] || (std::isnan(gpu[i]) && std::isnan(g[i]));
        if (!same && ++mismatches <= 5) ADD_FAILURE() << what << " [" << i << "]: cpu " << g[i] << " cuda " << gpu[i];
      }
      EXPECT_EQ(mismatches, 0) << what;
    }
  }
}

#endif

}  // namespace
}  // namespace dpe::kernels
