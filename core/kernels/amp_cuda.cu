// CUDA non-finite check and unscale (core/kernels/amp.h), PyTorch's
// _amp_foreach_non_finite_check_and_unscale_cuda_ for one tensor: a grid-stride loop in which every thread
// that meets an inf or NaN stores 1 into found_inf. The stores race, but all write the same value and nothing
// in the kernel reads the flag, so the result is 1 exactly when some element was non-finite.
#include <cmath>

#include "core/kernels/amp.h"
#include "core/kernels/arg_checks.h"
#include "core/kernels/cuda_launch.cuh"

namespace dpe::kernels {
namespace {

using detail::first_index;
using detail::grid_stride;

// grad: (n), scaled in place; found_inf: one float on the device.
template <typename T>
__global__ void amp_unscale_kernel(int64_t n, T* grad, T inv_scale, float* found_inf) {
  bool bad = false;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const T v = grad[i];
    bad |= !isfinite(v);
    grad[i] = v * inv_scale;
  }
  if (bad) *found_inf = 1.0f;
}

}  // namespace

void amp_unscale_cuda(cudaStream_t stream, DType dtype, int64_t n, void* grad, float inv_scale, float* found_inf) {
  detail::check_n("amp_unscale_cuda", n);
  DPE_INTERNAL_ASSERT(found_inf != nullptr, "amp_unscale_cuda: null found_inf");
  if (n == 0) return;
  detail::dispatch_compute_type(dtype, "amp_unscale_cuda", [&](auto tag) {
    using T = decltype(tag);
    amp_unscale_kernel<T><<<detail::grid_for(n), detail::kBlock, 0, stream>>>(n, static_cast<T*>(grad),
                                                                              static_cast<T>(inv_scale), found_inf);
    DPE_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dpe::kernels
