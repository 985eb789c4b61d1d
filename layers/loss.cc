// Losses on top of log_softmax and the nll gather (core/ops/loss_ops.h); reductions follow
// aten/src/ATen/native/LossNLL.cpp of PyTorch 1.13 (nll_loss_nd, cross_entropy_loss_label_smoothing).
#include "layers/loss.h"

#include "core/error.h"
#include "core/ops.h"
#include "core/ops/loss_ops.h"

namespace dpe::nn::functional {
namespace {

// A (C) input with a 0-dim target is one sample: (1, C) and (1).
struct Batched {
  Tensor input, target;
  bool unbatched = false;
};

Batched batch(const Tensor& input, const Tensor& target, const char* op) {
  DPE_CHECK(input.defined() && target.defined(), op, ": undefined input or target");
  if (input.dim() == 1) {
    DPE_CHECK(target.dim() == 0, op, ": target ", shape_str(target.shape()), " does not match input ",
              shape_str(input.shape()), " (an unbatched (C) input takes a 0-dim target)");
    return {input.unsqueeze(0), target.unsqueeze(0), true};
  }
  return {input, target, false};
}

// Applies `reduction` to per-position losses whose valid positions are marked by `valid`.
Tensor reduce(const Tensor& per_position, const Tensor& valid, Reduction reduction, bool unbatched) {
  switch (reduction) {
    case Reduction::None: return unbatched ? per_position.squeeze(0) : per_position;
    case Reduction::Sum: return sum(per_position);
    case Reduction::Mean: return div(sum(per_position), sum(valid));
  }
  DPE_CHECK(false, "unknown Reduction ", static_cast<int>(reduction));
}

// target must be (N, d1, ...) for an input (N, C, d1, ...); `input_word` names the input in the message.
void check_target_shape(const Tensor& input, const Tensor& target, const char* op, const char* input_word) {
  Shape expected{input.size(0)};
  for (int64_t d = 2; d < input.dim(); ++d) expected.push_back(input.size(d));
  DPE_CHECK(target.shape() == expected, op, ": target ", shape_str(target.shape()), " does not match ", input_word,
            " ", shape_str(input.shape()), " (expected target ", shape_str(expected), ")");
}

}  // namespace

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const NllLossOptions& options) {
  Batched b = batch(log_probs, target, "nll_loss");
  DPE_CHECK(b.input.dim() >= 2, "nll_loss: input ", shape_str(log_probs.shape()),
            " must be (C), (N, C) or (N, C, d1, ...)");
  check_target_shape(b.input, b.target, "nll_loss", "input");
  if (options.reduction == Reduction::Mean) return nll_loss_mean(b.input, b.target, options.ignore_index, "nll_loss");
  NllPerPosition nll = nll_per_position(b.input, b.target, options.ignore_index, "nll_loss");
  return reduce(nll.loss, nll.valid, options.reduction, b.unbatched);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options) {
  const double eps = options.label_smoothing;
  DPE_CHECK(eps >= 0.0 && eps <= 1.0, "cross_entropy: label_smoothing must be in [0, 1], got ", eps);
  Batched b = batch(logits, target, "cross_entropy");
  DPE_CHECK(b.input.dim() >= 2, "cross_entropy: input ", shape_str(logits.shape()),
            " must be (C), (N, C) or (N, C, d1, ...)");
  check_target_shape(b.input, b.target, "cross_entropy", "logits");
  if (eps == 0.0 && options.reduction == Reduction::Mean) {
    return cross_entropy_mean(b.input, b.target, options.ignore_index);
  }
  Tensor log_probs = log_softmax(b.input, 1);
  NllPerPosition nll = nll_per_position(log_probs, b.target, options.ignore_index, "cross_entropy");
  Tensor nll_loss = reduce(nll.loss, nll.valid, options.reduction, b.unbatched);
  if (eps == 0.0) return nll_loss;
  // smooth[n, ...] = -sum_c log p[n, c, ...], 0 where the target is ignored; reduced like the nll term.
  Tensor smooth = mul(neg(sum(log_probs, 1)), nll.valid);
  Tensor smooth_loss = reduce(smooth, nll.valid, options.reduction, b.unbatched);
  const double classes = static_cast<double>(b.input.size(1));
  return add(mul(nll_loss, 1.0 - eps), mul(smooth_loss, eps / classes));
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  DPE_CHECK(input.defined() && target.defined(), "mse_loss: undefined input or target");
  Tensor sq = square(sub(input, target));
  switch (reduction) {
    case Reduction::None: return sq;
    case Reduction::Sum: return sum(sq);
    case Reduction::Mean: return mean(sq);
  }
  DPE_CHECK(false, "mse_loss: unknown Reduction ", static_cast<int>(reduction));
}

}  // namespace dpe::nn::functional
