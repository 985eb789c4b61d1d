// CUDA fused optimizer steps; the per-element math is core/kernels/math.h, shared with the CPU.
#include "core/kernels/arg_checks.h"
#include "core/kernels/cuda_launch.cuh"
#include "core/kernels/math.h"
#include "core/kernels/optimizer.h"

namespace dpe::kernels {
namespace {

using detail::first_index;
using detail::grid_stride;

// param, grad, buf: (n); buf null without momentum.
template <typename Flags, typename T>
__global__ void sgd_step_kernel(int64_t n, T* param, const T* grad, T* buf, T lr, T momentum, T dampening_complement,
                                T weight_decay) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    param[i] = sgd_updated_param<Flags>(param[i], grad[i], Flags::momentum ? buf + i : nullptr, lr, momentum,
                                        dampening_complement, weight_decay);
  }
}

}  // namespace

void sgd_step_cuda(cudaStream_t stream, DType dtype, int64_t n, void* param, const void* grad, void* momentum_buffer,
                   const SgdStep& step) {
  detail::check_n("sgd_step_cuda", n);
  if (n == 0) return;
  DPE_INTERNAL_ASSERT(step.momentum == 0 || momentum_buffer != nullptr, "sgd_step_cuda: momentum without a buffer");
  detail::dispatch_compute_type(dtype, "sgd_step_cuda", [&](auto tag) {
    using T = decltype(tag);
    T* buf = step.momentum != 0 ? static_cast<T*>(momentum_buffer) : nullptr;
    const T weight_decay = static_cast<T>(step.weight_decay);
    dispatch_sgd_flags(buf != nullptr, step.first_step, step.nesterov, weight_decay != T(0), [&](auto flags) {
      sgd_step_kernel<decltype(flags), T><<<detail::grid_for(n), detail::kBlock, 0, stream>>>(
          n, static_cast<T*>(param), static_cast<const T*>(grad), buf, static_cast<T>(step.lr),
          static_cast<T>(step.momentum), static_cast<T>(1.0 - step.dampening), weight_decay);
      DPE_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace dpe::kernels
