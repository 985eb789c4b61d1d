// Gradient clipping: torch.nn.utils.clip_grad_norm_ (PyTorch 1.13).
#pragma once

#include <limits>
#include <vector>

#include "core/tensor.h"

namespace dpe::optim {

// The norm of all gradients together, as if concatenated into one vector: for p-norms
// (sum over params of ||g||_p^p)^(1/p) computed as the p-norm of the per-parameter norms (PyTorch's order),
// for norm_type = infinity the largest |g|. When total > max_norm - 1e-6 (the coefficient below is < 1),
// every gradient is scaled in place by max_norm / (total + 1e-6). Parameters without a grad are skipped;
// none at all gives 0. Returns the total norm before clipping. norm_type must be > 0.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0);

// Its two halves, for gradients split over devices (ZeRO: engine/zero_step.cc). grad_norm_power: the sum over
// params of ||g||_p^p (for infinity, the largest |g|), which shards add up (then the p-th root);
// clip_grads_with_norm_ (PyTorch's name): scales every gradient by max_norm / (total_norm + 1e-6) when that is
// < 1.
double grad_norm_power(const std::vector<Tensor>& params, double norm_type = 2.0);
void clip_grads_with_norm_(const std::vector<Tensor>& params, double max_norm, double total_norm);

}  // namespace dpe::optim
