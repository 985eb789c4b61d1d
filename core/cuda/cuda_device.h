// Logical CUDA devices and their per-device resources. Included only by CUDA-enabled code.
//
// Logical device i maps onto a physical (visible) GPU: by default logical == physical, or the list in
// $DPE_CUDA_LOGICAL_DEVICES ("0,0": two logical devices on GPU 0); set_logical_devices changes it in code.
// Several logical devices may share one GPU (multi-device tests on one GPU). Each logical device owns one
// non-blocking compute stream and one cuBLAS and one cuDNN handle bound to it, created on first use. Every
// kernel for logical device i runs on stream(i): that single stream is what makes the caching allocator's reuse safe.
//
// Thread-safety: all functions may be called from any thread; per-device resources are created once.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <string>
#include <vector>

namespace dpe::cuda {

int physical_device_count();       // cudaGetDeviceCount; 0 (not an error) when no driver/GPU
std::string unavailable_reason();  // why physical_device_count() is 0, e.g. the driver's message
int logical_device_count();
void set_logical_devices(const std::vector<int>& physical_ordinals);  // throws on an invalid ordinal
int physical_device(int logical);

// What `dpe devices` shows of a logical device's GPU.
struct GpuInfo {
  std::string name;
  int compute_major = 0, compute_minor = 0;
  size_t total_bytes = 0, free_bytes = 0;
};
GpuInfo gpu_info(int logical);
// True when logical devices a and b may copy peer to peer (same physical GPU counts as true).
bool can_access_peer(int a, int b);

cudaStream_t stream(int logical);
cublasHandle_t cublas_handle(int logical);
// The device's cuDNN handle, created on first use and bound to stream(logical) (like cublas_handle).
cudnnHandle_t cudnn_handle(int logical);
void synchronize(int logical);  // waits for the device's stream

// Makes the logical device's GPU current on this thread for the guard's lifetime.
class DeviceGuard {
 public:
  explicit DeviceGuard(int logical);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace dpe::cuda
