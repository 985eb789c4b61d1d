// Dropout (PyTorch's torch.nn.functional.dropout, inverted).
#pragma once

#include "core/ops.h"
#include "core/tensor.h"

namespace dpe {

// x: any shape  ->  x's shape
// training and 0 < p < 1: y = x * mask / (1 - p), mask ~ Bernoulli(1 - p) elementwise, drawn from `gen` or,
// when null, from the default generator of x's device (per-device RNG: every device has its own stream of
// numbers, and the same seed and offset give the same mask on CPU and CUDA). Backward: dy * mask / (1 - p).
// p == 1: zeros (gradient zero). Eval or p == 0: x itself (no copy, no random numbers consumed).
// p outside [0, 1] is an error.
Tensor dropout(const Tensor& x, double p, bool training, Generator* gen = nullptr);

}  // namespace dpe
