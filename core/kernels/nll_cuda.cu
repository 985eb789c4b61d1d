// CUDA nll gather/scatter (core/kernels/nll.h): one thread per (outer, inner) position in a grid-stride
// loop. The op layer has checked the targets on the host (the contract in nll.h); an out-of-range target
// that slips through is treated like an ignored one, so no thread reads or writes out of bounds.
// Results are bit-identical to the CPU's (a negation and a copy per position).
#include <cstdint>

#include "core/kernels/arg_checks.h"
#include "core/kernels/cuda_launch.cuh"
#include "core/kernels/nll.h"

namespace dpe::kernels {
namespace {

using detail::dispatch_compute_type;
using detail::first_index;
using detail::grid_for;
using detail::grid_stride;
using detail::kBlock;

__device__ __forceinline__ bool target_ok(int64_t t, int64_t classes, int64_t ignore_index) {
  return t != ignore_index && t >= 0 && t < classes;
}

// log_probs: (outer, classes, inner)  target, loss, valid: (outer, inner)
template <typename T>
__global__ void nll_forward_kernel(int64_t outer, int64_t classes, int64_t inner, const T* log_probs,
                                   const int64_t* target, int64_t ignore_index, T* loss, T* valid) {
  for (int64_t k = first_index(); k < outer * inner; k += grid_stride()) {
    const int64_t o = k / inner, i = k % inner;
    const int64_t t = target[k];
    const bool ok = target_ok(t, classes, ignore_index);
    loss[k] = ok ? -log_probs[(o * classes + t) * inner + i] : T(0);
    valid[k] = ok ? T(1) : T(0);
  }
}

// grad_log_probs: (outer, classes, inner), zeroed before the launch; target, grad_loss: (outer, inner)
template <typename T>
__global__ void nll_backward_kernel(int64_t outer, int64_t classes, int64_t inner, const int64_t* target,
                                    int64_t ignore_index, const T* grad_loss, T* grad_log_probs) {
  for (int64_t k = first_index(); k < outer * inner; k += grid_stride()) {
    const int64_t o = k / inner, i = k % inner;
    const int64_t t = target[k];
    if (target_ok(t, classes, ignore_index)) grad_log_probs[(o * classes + t) * inner + i] = -grad_loss[k];
  }
}

}  // namespace

void nll_forward_cuda(cudaStream_t stream, DType dtype, int64_t outer, int64_t classes, int64_t inner,
                      const void* log_probs, const int64_t* target, int64_t ignore_index, void* loss, void* valid) {
  detail::check_axis_dims("nll_forward_cuda", outer, classes, inner);
  const int64_t n = outer * inner;
  if (n == 0) return;
  dispatch_compute_type(dtype, "nll_forward_cuda", [&](auto tag) {
    using T = decltype(tag);
    nll_forward_kernel<T><<<grid_for(n), kBlock, 0, stream>>>(outer, classes, inner, static_cast<const T*>(log_probs),
                                                             target, ignore_index, static_cast<T*>(loss),
                                                             static_cast<T*>(valid));
    DPE_CUDA_CHECK_LAUNCH();
  });
}

void nll_backward_cuda(cudaStream_t stream, DType dtype, int64_t outer, int64_t classes, int64_t inner,
                       const int64_t* target, int64_t ignore_index, const void* grad_loss, void* grad_log_probs) {
  detail::check_axis_dims("nll_backward_cuda", outer, classes, inner);
  const int64_t total = outer * classes * inner;
  if (total == 0) return;
  dispatch_compute_type(dtype, "nll_backward_cuda", [&](auto tag) {
    using T = decltype(tag);
    DPE_CUDA_CHECK(cudaMemsetAsync(grad_log_probs, 0, static_cast<size_t>(total) * sizeof(T), stream));
    const int64_t n = outer * inner;
    nll_backward_kernel<T><<<grid_for(n), kBlock, 0, stream>>>(outer, classes, inner, target, ignore_index,
                                                              static_cast<const T*>(grad_loss),
                                                              static_cast<T*>(grad_log_probs));
    DPE_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dpe::kernels
