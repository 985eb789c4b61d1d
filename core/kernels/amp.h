// Mixed-precision kernels: PyTorch's _amp_foreach_non_finite_check_and_unscale_ for one gradient at a time
// (optim/grad_scaler.h calls it once per gradient, all of one device sharing one found_inf flag).
//
// Contract: found_inf is set (to 1) when an element of grad was inf or NaN *before* unscaling, and is never
// cleared, so one flag collects a whole set of gradients. Each element is tested by itself: a gradient whose
// elements are all finite is clean however large their sum would be (a composition such as
// isfinite(sum(grad)) would count an overflowing sum as an inf), and a NaN is always found (a max-based test
// can lose it). Every element is multiplied by inv_scale, non-finite ones included (as PyTorch: the step
// is skipped anyway, and the gradient is what the caller's unscale_ said it would be).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/kernels/backend_types.h"

namespace dpe::kernels {

// grad: (n) contiguous, float32 or float64, scaled in place by inv_scale (a float32 value: PyTorch's
// scale.double().reciprocal().float(), applied in grad's dtype). found_inf: one float32, host memory for the
// CPU kernel, memory of the stream's device for the CUDA one (read it back after the stream's work).
void amp_unscale_cpu(DType dtype, int64_t n, void* grad, float inv_scale, float* found_inf);
void amp_unscale_cuda(cudaStream_t stream, DType dtype, int64_t n, void* grad, float inv_scale, float* found_inf);

}  // namespace dpe::kernels
