// CUDA nll gather/scatter (core/kernels/nll.h): one thread per (outer, inner) position in a grid-stride
// loop; reduction='mean' in one block forward, one thread per element backward. The op layer has checked the
// targets on the host (the contract in nll.h); an out-of-range target that slips through is treated like an
// ignored one, so no thread reads or writes out of bounds. The per-position results are bit-identical to the
// CPU's (a negation and a copy per position); the mean's sum is in another order than the CPU's sum().
#include <cstdint>

#include "core/kernels/arg_checks.h"
#include "core/kernels/cuda_launch.cuh"
#include "core/kernels/nll.h"

namespace dpe::kernels {
namespace {

using detail::block_reduce;
using detail::dispatch_compute_type;
using detail::first_index;
using detail::grid_for;
using detail::grid_stride;
using detail::kBlock;
using detail::kMaxRowBlock;
using detail::SumCombine;

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

// One block of kMaxRowBlock threads: thread t sums positions t, t + blockDim.x, ...; then fixed trees.
template <typename T>
__global__ void nll_mean_forward_kernel(int64_t outer, int64_t classes, int64_t inner, const T* log_probs,
                                        const int64_t* target, int64_t ignore_index, T* out, T* count) {
  __shared__ double shared[kMaxRowBlock];
  double loss = 0, valid = 0;
  for (int64_t k = threadIdx.x; k < outer * inner; k += blockDim.x) {
    const int64_t t = target[k];
    if (!target_ok(t, classes, ignore_index)) continue;
    const int64_t o = k / inner, i = k % inner;
    loss -= static_cast<double>(log_probs[(o * classes + t) * inner + i]);
    valid += 1;
  }
  loss = block_reduce(loss, shared, SumCombine{});
  valid = block_reduce(valid, shared, SumCombine{});
  if (threadIdx.x == 0) {
    *count = static_cast<T>(valid);
    *out = static_cast<T>(loss) / static_cast<T>(valid);
  }
}

// Every element of grad_log_probs (outer, classes, inner), one thread each.
template <typename T>
__global__ void nll_mean_backward_kernel(int64_t outer, int64_t classes, int64_t inner, const int64_t* target,
                                         int64_t ignore_index, const T* grad_out, const T* count, T* grad_log_probs) {
  const T g = -(*grad_out / *count);
  for (int64_t e = first_index(); e < outer * classes * inner; e += grid_stride()) {
    const int64_t i = e % inner, c = e / inner % classes, o = e / (inner * classes);
    const int64_t t = target[o * inner + i];
    grad_log_probs[e] = t == c && target_ok(t, classes, ignore_index) ? g : T(0);
  }
}

}  // namespace

void nll_mean_forward_cuda(cudaStream_t stream, DType dtype, int64_t outer, int64_t classes, int64_t inner,
                           const void* log_probs, const int64_t* target, int64_t ignore_index, void* out,
                           void* count) {
  detail::check_axis_dims("nll_mean_forward_cuda", outer, classes, inner);
  dispatch_compute_type(dtype, "nll_mean_forward_cuda", [&](auto tag) {
    using T = decltype(tag);
    nll_mean_forward_kernel<T><<<1, kMaxRowBlock, 0, stream>>>(outer, classes, inner,
                                                               static_cast<const T*>(log_probs), target,
                                                               ignore_index, static_cast<T*>(out),
                                                               static_cast<T*>(count));
    DPE_CUDA_CHECK_LAUNCH();
  });
}

void nll_mean_backward_cuda(cudaStream_t stream, DType dtype, int64_t outer, int64_t classes, int64_t inner,
                            const int64_t* target, int64_t ignore_index, const void* grad_out, const void* count,
                            void* grad_log_probs) {
  detail::check_axis_dims("nll_mean_backward_cuda", outer, classes, inner);
  const int64_t total = outer * classes * inner;
  if (total == 0) return;
  dispatch_compute_type(dtype, "nll_mean_backward_cuda", [&](auto tag) {
    using T = decltype(tag);
    nll_mean_backward_kernel<T><<<grid_for(total), kBlock, 0, stream>>>(
        outer, classes, inner, target, ignore_index, static_cast<const T*>(grad_out), static_cast<const T*>(count),
        static_cast<T*>(grad_log_probs));
    DPE_CUDA_CHECK_LAUNCH();
  });
}

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
