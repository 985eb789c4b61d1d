// Runs a kernel on the backend of a device: `cpu()` on CPU devices, `cuda(stream)` on CUDA devices with
// the device's GPU current and its compute stream passed explicitly.
//
// Both return through a lost-thread checkpoint (core/lost_thread.h): a kernel that returns on a worker
// the engine has given up on goes no further.
//
// `cuda` must be a generic lambda ([&](auto stream) {...}): in a build without CUDA it is never
// instantiated, so it may name *_cuda kernels that this build does not define.
#pragma once

#include "core/device.h"
#include "core/error.h"
#include "core/lost_thread.h"

#if DPE_WITH_CUDA
#include "core/cuda/cuda_device.h"
#endif

namespace dpe {

template <typename CpuFn, typename CudaFn>
void dispatch(const Device& device, CpuFn&& cpu, CudaFn&& cuda) {
  if (device.is_cpu()) {
    cpu();
    checkpoint_if_lost();
    return;
  }
#if DPE_WITH_CUDA
  cuda::DeviceGuard guard(device.index);
  cuda(cuda::stream(device.index));
  checkpoint_if_lost();
#else
  (void)cuda;
  DPE_CHECK(false, "cannot run on ", device, ": this dpe build has no CUDA support");
#endif
}

// dispatch() for a kernel only CPU devices have, the caller having checked the device (a fused CPU kernel whose
// op composes tensor ops elsewhere): keeps the lost-thread checkpoint.
template <typename CpuFn>
void dispatch_cpu_only(const Device& device, CpuFn&& cpu) {
  dispatch(device, cpu, [&](auto) { DPE_INTERNAL_ASSERT(false, "a CPU-only kernel on ", device); });
}

// dispatch() for a kernel only CUDA devices have, the caller having checked the device; `cuda` is generic as
// in dispatch().
template <typename CudaFn>
void dispatch_cuda_only(const Device& device, CudaFn&& cuda) {
  dispatch(device, [&] { DPE_INTERNAL_ASSERT(false, "a CUDA-only kernel on ", device); }, cuda);
}

}  // namespace dpe
