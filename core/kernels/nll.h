// Negative log-likelihood gather/scatter: the kernel behind nll_loss and cross_entropy
// (core/ops/loss_ops.h). log_probs and grad_log_probs are contiguous, viewed as (outer, classes, inner);
// target, loss, valid and grad_loss are contiguous (outer, inner). dtype (float32 or float64) is the dtype
// of the float operands; target is int64.
//
// Contract on targets: every target is ignore_index or in [0, classes). The CPU kernels check it and throw
// naming the value and `classes`; the CUDA kernels cannot throw, so the op layer checks the targets on the
// host before launching (core/ops/loss_ops.cc), and the CUDA kernels treat an out-of-range target like an
// ignored one (defensive: never an out-of-bounds read or write).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/kernels/backend_types.h"

namespace dpe::kernels {

// loss[o, i]  = -log_probs[o, target[o, i], i], or 0 where target[o, i] == ignore_index
// valid[o, i] = 1 where target[o, i] != ignore_index, else 0   (same dtype as loss)
void nll_forward_cpu(DType dtype, int64_t outer, int64_t classes, int64_t inner, const void* log_probs,
                     const int64_t* target, int64_t ignore_index, void* loss, void* valid);
void nll_forward_cuda(cudaStream_t stream, DType dtype, int64_t outer, int64_t classes, int64_t inner,
                      const void* log_probs, const int64_t* target, int64_t ignore_index, void* loss, void* valid);

// grad_log_probs = 0 everywhere, then grad_log_probs[o, target[o, i], i] = -grad_loss[o, i] for every
// non-ignored (o, i). Overwrites (=) grad_log_probs.
void nll_backward_cpu(DType dtype, int64_t outer, int64_t classes, int64_t inner, const int64_t* target,
                      int64_t ignore_index, const void* grad_loss, void* grad_log_probs);
void nll_backward_cuda(cudaStream_t stream, DType dtype, int64_t outer, int64_t classes, int64_t inner,
                       const int64_t* target, int64_t ignore_index, const void* grad_loss, void* grad_log_probs);

// reduction='mean' on CUDA in one launch each way (the composition of nll_forward with two sums and a division
// takes five forward and four backward; the CPU keeps composing, it has no launches to save):
//   count[0] = the number of non-ignored positions, out[0] = (sum of their losses) / count[0],
// each sum in double over a fixed tree in one block, rounded to dtype before the division (the composition's
// roundings); 0 / 0 = NaN when every target is ignored, as in PyTorch. out and count: one element each.
void nll_mean_forward_cuda(cudaStream_t stream, DType dtype, int64_t outer, int64_t classes, int64_t inner,
                           const void* log_probs, const int64_t* target, int64_t ignore_index, void* out,
                           void* count);
// grad_log_probs[o, c, i] = -(grad_out[0] / count[0]) where c == target[o, i] is not ignored, else 0
// (overwrites every element). grad_out and count: one element each, on the device.
void nll_mean_backward_cuda(cudaStream_t stream, DType dtype, int64_t outer, int64_t classes, int64_t inner,
                            const int64_t* target, int64_t ignore_index, const void* grad_out, const void* count,
                            void* grad_log_probs);

}  // namespace dpe::kernels
