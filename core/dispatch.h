// Runs a kernel on the backend of a device: `cpu()` on CPU devices, `cuda(stream)` on CUDA devices with
// the device's GPU current and its compute stream passed explicitly.
//
// `cuda` must be a generic lambda ([&](auto stream) {...}): in a build without CUDA it is never
// instantiated, so it may name *_cuda kernels that this build does not define.
#pragma once

#include "core/device.h"
#include "core/error.h"

#if DPE_WITH_CUDA
#include "core/cuda/cuda_device.h"
#endif

namespace dpe {

template <typename CpuFn, typename CudaFn>
void dispatch(const Device& device, CpuFn&& cpu, CudaFn&& cuda) {
  if (device.is_cpu()) {
    cpu();
    return;
  }
#if DPE_WITH_CUDA
  cuda::DeviceGuard guard(device.index);
  cuda(cuda::stream(device.index));
#else
  (void)cuda;
  DPE_CHECK(false, "cannot run on ", device, ": this dpe build has no CUDA support");
#endif
}

}  // namespace dpe
