#include "core/stream.h"

#include <chrono>

#include "core/error.h"

#if DPE_WITH_CUDA
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_device.h"
#endif

namespace dpe {

void synchronize(const Device& d) {
  if (d.is_cpu()) return;
#if DPE_WITH_CUDA
  cuda::synchronize(d.index);
#else
  check_device_exists(d);
#endif
}

struct Event::Impl {
  Device device;
  bool recorded = false;
  std::chrono::steady_clock::time_point cpu_time;  // CPU: work is complete when recorded
#if DPE_WITH_CUDA
  cudaEvent_t cuda_event = nullptr;
  ~Impl() {
    if (cuda_event != nullptr) cudaEventDestroy(cuda_event);  // no throw from a destructor
  }
#endif
};

Event::Event() : impl_(std::make_unique<Impl>()) {}
Event::~Event() = default;
Event::Event(Event&&) noexcept = default;
Event& Event::operator=(Event&&) noexcept = default;

void Event::record(const Device& d) {
  check_device_exists(d);
  impl_->device = d;
  impl_->recorded = true;
  if (d.is_cpu()) {
    impl_->cpu_time = std::chrono::steady_clock::now();
    return;
  }
#if DPE_WITH_CUDA
  cuda::DeviceGuard guard(d.index);
  if (impl_->cuda_event == nullptr) DPE_CUDA_CHECK(cudaEventCreate(&impl_->cuda_event));
  DPE_CUDA_CHECK(cudaEventRecord(impl_->cuda_event, cuda::stream(d.index)));
#endif
}

void Event::block(const Device& d) const {
  DPE_CHECK(impl_->recorded, "Event::block(", d, "): the event was never recorded");
  if (d.is_cpu() || impl_->device.is_cpu()) {
    // A CPU-recorded point is already complete; a CPU device waiting for CUDA work must block the host.
    if (d.is_cpu()) synchronize();
    return;
  }
#if DPE_WITH_CUDA
  cuda::DeviceGuard guard(d.index);
  DPE_CUDA_CHECK(cudaStreamWaitEvent(cuda::stream(d.index), impl_->cuda_event, 0));
#endif
}

void Event::synchronize() const {
  DPE_CHECK(impl_->recorded, "Event::synchronize(): the event was never recorded");
  if (impl_->device.is_cpu()) return;
#if DPE_WITH_CUDA
  DPE_CUDA_CHECK(cudaEventSynchronize(impl_->cuda_event));
#endif
}

double Event::elapsed_ms(const Event& later) const {
  DPE_CHECK(impl_->recorded && later.impl_->recorded, "Event::elapsed_ms: both events must be recorded");
  DPE_CHECK(impl_->device.kind == later.impl_->device.kind, "Event::elapsed_ms: events recorded on ",
            impl_->device, " and ", later.impl_->device, " are not comparable");
  if (impl_->device.is_cpu()) {
    return std::chrono::duration<double, std::milli>(later.impl_->cpu_time - impl_->cpu_time).count();
  }
#if DPE_WITH_CUDA
  float ms = 0;
  DPE_CUDA_CHECK(cudaEventElapsedTime(&ms, impl_->cuda_event, later.impl_->cuda_event));
  return ms;
#else
  DPE_INTERNAL_ASSERT(false, "CUDA event in a build without CUDA");
#endif
}

}  // namespace dpe
