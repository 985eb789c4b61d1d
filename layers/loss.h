// Loss functions (PyTorch's torch.nn.functional losses, 1.13 semantics).
//
//   Tensor loss = nn::functional::cross_entropy(logits, labels);                      // mean over N
//   Tensor l2 = nn::functional::cross_entropy(logits, labels, {.label_smoothing = 0.1});
//
// Shapes: input (N, C) or (N, C, d1, d2, ...) (or (C) with a 0-dim target); target int64 (N) or
// (N, d1, d2, ...) of class indices in [0, C), or ignore_index. Reduction::None returns the per-position
// losses (N, d1, ...); Sum their sum; Mean their sum divided by the number of non-ignored targets (so a batch
// whose targets are all ignored gives 0/0 = NaN, as PyTorch 1.13 does).
#pragma once

#include <cstdint>
#include <functional>

#include "core/tensor.h"

namespace dpe {

// A loss as DataParallel's step API takes it: (output, target) -> a 0-dim tensor (engine/data_parallel.h
// says where each mode computes it and on which thread).
using LossFn = std::function<Tensor(const Tensor& output, const Tensor& target)>;

}  // namespace dpe

namespace dpe::nn {

enum class Reduction { None, Mean, Sum };

namespace functional {

struct NllLossOptions {
  Reduction reduction = Reduction::Mean;
  int64_t ignore_index = -100;
};

struct CrossEntropyOptions {
  Reduction reduction = Reduction::Mean;
  int64_t ignore_index = -100;
  // ε in [0, 1]: loss = (1 - ε) * nll + ε * (mean over classes of -log p), both terms over non-ignored
  // positions only (and Mean divides both by the number of non-ignored targets), as torch 1.13.
  double label_smoothing = 0.0;
};

// log_probs: log-probabilities (e.g. log_softmax(x, 1)), shapes as in the file comment.
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const NllLossOptions& options = {});

// logits: unnormalised scores; log_softmax over dim 1, then nll_loss (plus label smoothing).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options = {});

// (input - target)^2, reduced. Shapes broadcast like PyTorch's mse_loss (which warns when they differ; here
// they simply broadcast).
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);

}  // namespace functional
}  // namespace dpe::nn
