// Normalisation ops composed from differentiable ops (see core/ops/norm.h).
#include "core/ops/norm.h"

#include "core/autograd/grad_mode.h"
#include "core/ops.h"
#include "core/ops/op_checks.h"

namespace dpe {

namespace {

// A defined per-channel tensor must be (size) on x's device with x's dtype.
void check_param(const Tensor& x, const Tensor& p, const Shape& expected, const char* op, const char* name) {
  if (!p.defined()) return;
  DPE_CHECK(p.shape() == expected, op, ": ", name, " has shape ", shape_str(p.shape()), ", expected ",
            shape_str(expected), " for input ", shape_str(x.shape()));
  DPE_CHECK(p.device() == x.device(), op, ": ", name, " is on ", p.device(), " but the input is on ", x.device());
  DPE_CHECK(p.dtype() == x.dtype(), op, ": ", name, " is ", p.dtype(), " but the input is ", x.dtype());
}

}  // namespace

// x: (N, C, *)  stats/affine: (C)  ->  (N, C, *)
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps) {
  detail::check_compute_dtype(x, "batch_norm");
  DPE_CHECK(x.dim() >= 2, "batch_norm: expected input (N, C, *) with at least 2 dims, got ", shape_str(x.shape()));
  const int64_t C = x.size(1);
  for (auto [p, name] : {std::pair{&running_mean, "running_mean"}, std::pair{&running_var, "running_var"},
                         std::pair{&weight, "weight"}, std::pair{&bias, "bias"}}) {
    check_param(x, *p, {C}, "batch_norm", name);
  }
  DPE_CHECK(running_mean.defined() == running_var.defined(),
            "batch_norm: running_mean and running_var must both be given or both be absent");
  DPE_CHECK(eps >= 0, "batch_norm: eps ", eps, " is negative");

  // Work on x viewed as (N, C, S), S = product of the spatial dims (a view when x is contiguous): the
  // statistics are two reductions (over S, then N) whatever x's rank.
  const int64_t N = x.size(0);
  const int64_t S = N * C > 0 ? x.numel() / (N * C) : 0;
  Tensor x3 = x.reshape({N, C, S});
  const Shape param_shape{1, C, 1};  // broadcasts a (C) tensor over (N, C, S)
  const int64_t count = N * S;        // values per channel

  Tensor y;
  if (training || !running_mean.defined()) {
    DPE_CHECK(count > (training ? 1 : 0), "batch_norm: expected more than 1 value per channel when training, got input ",
              "size ", shape_str(x.shape()));
    const double inv_count = 1.0 / static_cast<double>(count);
    Tensor mean = mul(sum(x3, {0, 2}, /*keepdim=*/true), inv_count);  // (1, C, 1)
    Tensor centered = sub(x3, mean);
    Tensor var = mul(sum(square(centered), {0, 2}, /*keepdim=*/true), inv_count);  // biased, (1, C, 1)
    y = mul(centered, rsqrt(add(var, eps)));
    if (training && running_mean.defined()) {
      NoGradGuard no_grad;
      const double unbias = static_cast<double>(count) / static_cast<double>(count - 1);
      Tensor rm = running_mean, rv = running_var;  // handles: the update lands in the caller's buffers
      rm.mul_(1.0 - momentum);
      rm.add_(mean.detach().reshape({C}), momentum);
      rv.mul_(1.0 - momentum);
      rv.add_(var.detach().reshape({C}), momentum * unbias);
    }
  } else {
    Tensor rm = running_mean.detach().view(param_shape), rv = running_var.detach().view(param_shape);
    y = mul(sub(x3, rm), rsqrt(add(rv, eps)));
  }
  if (weight.defined()) y = mul(y, weight.view(param_shape));
  if (bias.defined()) y = add(y, bias.view(param_shape));
  y = y.reshape(x.shape());
  return y;
}

// x: (*, normalized_shape)  weight, bias: normalized_shape  ->  x's shape
Tensor layer_norm(const Tensor& x, const std::vector<int64_t>& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  detail::check_compute_dtype(x, "layer_norm");
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  DPE_CHECK(k >= 1, "layer_norm: normalized_shape must not be empty");
  bool trailing_match = x.dim() >= k;
  for (int64_t i = 0; trailing_match && i < k; ++i) trailing_match = x.size(x.dim() - k + i) == normalized_shape[i];
  DPE_CHECK(trailing_match, "layer_norm: input ", shape_str(x.shape()), " does not end with normalized_shape ",
            shape_str(normalized_shape));
  check_param(x, weight, normalized_shape, "layer_norm", "weight");
  check_param(x, bias, normalized_shape, "layer_norm", "bias");
  const int64_t m = shape_numel(normalized_shape);
  DPE_CHECK(m > 0, "layer_norm: normalized_shape ", shape_str(normalized_shape), " has no elements");

  Tensor rows = x.reshape({-1, m});  // (R, M)
  Tensor centered = sub(rows, mean(rows, 1, /*keepdim=*/true));
  Tensor var = mean(square(centered), 1, /*keepdim=*/true);  // biased, (R, 1)
  Tensor y = mul(centered, rsqrt(add(var, eps))).reshape(x.shape());
  if (weight.defined()) y = mul(y, weight);  // broadcasts over the leading dims
  if (bias.defined()) y = add(y, bias);
  return y;
}

// x: (*, D)  weight: (D)  ->  x's shape
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  detail::check_compute_dtype(x, "rms_norm");
  DPE_CHECK(x.dim() >= 1 && x.size(-1) > 0, "rms_norm: expected input (*, D) with D > 0, got ", shape_str(x.shape()));
  check_param(x, weight, {x.size(-1)}, "rms_norm", "weight");
  Tensor y = mul(x, rsqrt(add(mean(square(x), -1, /*keepdim=*/true), eps)));
  if (weight.defined()) y = mul(y, weight);
  return y;
}

}  // namespace dpe
