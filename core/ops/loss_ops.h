// The differentiable gather behind nll_loss / cross_entropy (layers/loss.h builds the reductions on top).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace dpe {

struct NllPerPosition {
  Tensor loss;   // (N, d1, ...): -log_probs[n, target[n, ...], ...], 0 where the target is ignored
  Tensor valid;  // (N, d1, ...), log_probs' dtype: 1 where the target is not ignore_index, else 0 (no grad)
};

// log_probs: (N, C, d1, ...) float32/float64; target: (N, d1, ...) int64 on the same device.
// Every target must be ignore_index or in [0, C): otherwise throws naming the value and C (for CUDA tensors
// the targets are copied to the host and checked before the launch). Differentiable in log_probs: the
// gradient scatters -grad_loss into the target positions (ignored positions get 0).
NllPerPosition nll_per_position(const Tensor& log_probs, const Tensor& target, int64_t ignore_index,
                                const char* op = "nll_loss");

// nll_loss with reduction='mean': the sum of the non-ignored positions' losses over their count, a 0-dim tensor
// (NaN when every target is ignored, as in PyTorch). Same arguments, checks and gradient as nll_per_position
// reduced by sums and a division, which is what it is on CPU devices; on CUDA devices it is one kernel forward
// and one backward where the composition launches five and four (a small model's step is launch-bound).
Tensor nll_loss_mean(const Tensor& log_probs, const Tensor& target, int64_t ignore_index, const char* op = "nll_loss");

// cross_entropy(logits, target) with reduction='mean' and no label smoothing: nll_loss_mean(log_softmax(logits,
// 1), target, ignore_index), which is what it is for other shapes and dtypes. For (N, C) float32/float64 logits
// it never makes the (N, C) log-probabilities: the forward keeps a few numbers per row (the row's maximum and
// log-sum-exp) beside the logits, and the backward writes the logits' gradient from them in one pass, where the
// composition holds the log-probabilities from the forward and makes the nll's dense (N, C) gradient beside the
// result (a language model's (B * T, vocabulary) logits: two fewer tensors of their size). The same bits as the
// composition on the same device, forward and backward; on CUDA devices two launches forward and one backward
// (kernels/softmax.h).
Tensor cross_entropy_mean(const Tensor& logits, const Tensor& target, int64_t ignore_index);

}  // namespace dpe
