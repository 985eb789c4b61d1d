// Normalisation ops: batch_norm on the fused kernels of core/kernels/batch_norm.h, rms_norm on those of
// core/kernels/rms_norm.h, layer_norm composed from differentiable ops (core/ops/norm.h).
#include "core/ops/norm.h"

#include "core/autograd/function.h"
#include "core/autograd/grad_mode.h"
#include "core/dispatch.h"
#include "core/kernels/batch_norm.h"
#include "core/kernels/rms_norm.h"
#include "core/ops.h"
#include "core/ops/op_checks.h"

namespace dpe {

using detail::data_or_null;
using detail::options_of;

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

void increment_batch_count(const Tensor& num_batches_tracked) {
  NoGradGuard no_grad;
  Tensor counter = num_batches_tracked;  // a handle: the count lands in the caller's buffer
  counter.copy_(add(num_batches_tracked.to(DType::Float64), 1.0));
}

// x: (N, C, *)  stats/affine: (C)  ->  (N, C, *)
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps, const Tensor& num_batches_tracked) {
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
  if (num_batches_tracked.defined()) {
    DPE_CHECK(num_batches_tracked.dtype() == DType::Int64 && num_batches_tracked.numel() == 1 &&
                  num_batches_tracked.is_contiguous(),
              "batch_norm: num_batches_tracked must be one int64 value, got ", num_batches_tracked.dtype(), " ",
              shape_str(num_batches_tracked.shape()));
    DPE_CHECK(num_batches_tracked.device() == x.device(), "batch_norm: num_batches_tracked is on ",
              num_batches_tracked.device(), " but the input is on ", x.device());
  }

  // x viewed as (N, C, S), S = the product of the spatial dims, for the kernels (core/kernels/batch_norm.h):
  // two passes forward (statistics, normalisation) and two backward (per-channel sums, input gradient).
  const int64_t N = x.size(0);
  const int64_t S = N * C > 0 ? x.numel() / (N * C) : 1;
  // Note [Memory formats]: a channels-last x stays so on CPU (its own kernels), y and dx too.
  const bool channels_last =
      x.device().is_cpu() && x.dim() == 4 && x.suggest_memory_format() == MemoryFormat::ChannelsLast;
  const MemoryFormat format = channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  const kernels::BatchNormShape shape{x.dtype(), N, C, S, channels_last};
  const int64_t count = N * S;  // values per channel
  const Tensor xc = x.detach().contiguous(format);
  const TensorOptions per_channel = options_of(x);

  const bool batch_stats = training || !running_mean.defined();
  Tensor mean, invstd;
  if (batch_stats) {
    DPE_CHECK(count > (training ? 1 : 0), "batch_norm: expected more than 1 value per channel when training, got input ",
              "size ", shape_str(x.shape()));
    mean = Tensor::empty({C}, per_channel);
    Tensor var = Tensor::empty({C}, per_channel);
    invstd = Tensor::empty({C}, per_channel);
    // The statistics pass also writes invstd and, training, updates the running statistics in place
    // (kernels::BatchNormStatsExtras): six launches fewer on a GPU than the tensor ops.
    kernels::BatchNormStatsExtras extras{.invstd = invstd.data_ptr(), .eps = eps};
    const bool update_running = training && running_mean.defined();
    const bool fused_update = update_running && running_mean.is_contiguous() && running_var.is_contiguous();
    if (fused_update) {
      extras.running_mean = running_mean.data_ptr();
      extras.running_var = running_var.data_ptr();
      extras.momentum = momentum;
    }
    const bool counting = training && num_batches_tracked.defined();
    if (counting && C > 0) extras.num_batches_tracked = num_batches_tracked.data<int64_t>();
    dispatch(
        x.device(),
        [&] { kernels::batch_norm_stats_cpu(shape, xc.data_ptr(), mean.data_ptr(), var.data_ptr(), extras); },
        [&](auto stream) {
          kernels::batch_norm_stats_cuda(stream, shape, xc.data_ptr(), mean.data_ptr(), var.data_ptr(), extras);
        });
    if (counting && C == 0) increment_batch_count(num_batches_tracked);  // no channel: no statistics pass
    if (update_running && !fused_update) {
      // Strided buffers: the same update (the same roundings) as tensor ops.
      NoGradGuard no_grad;
      const double unbias = static_cast<double>(count) / static_cast<double>(count - 1);
      Tensor rm = running_mean, rv = running_var;  // handles: the update lands in the caller's buffers
      rm.mul_(1.0 - momentum);
      rm.add_(mean, momentum);
      rv.mul_(1.0 - momentum);
      rv.add_(var, momentum * unbias);
    }
  } else {
    NoGradGuard no_grad;
    mean = running_mean.detach().clone();  // the node keeps the values this forward used
    invstd = rsqrt(add(running_var.detach(), eps));
  }

  const Tensor w = weight.defined() ? weight.detach() : Tensor(), b = bias.defined() ? bias.detach() : Tensor();
  Tensor y = Tensor::empty(x.shape(), options_of(x), format);
  dispatch(
      x.device(),
      [&] {
        kernels::batch_norm_elemt_cpu(shape, xc.data_ptr(), mean.data_ptr(), invstd.data_ptr(), data_or_null(w),
                                      data_or_null(b), y.data_ptr());
      },
      [&](auto stream) {
        kernels::batch_norm_elemt_cuda(stream, shape, xc.data_ptr(), mean.data_ptr(), invstd.data_ptr(),
                                       data_or_null(w), data_or_null(b), y.data_ptr());
      });

  const bool grad_x = x.requires_grad(), grad_w = weight.defined() && weight.requires_grad();
  const bool grad_b = bias.defined() && bias.requires_grad();
  autograd::record(y, {x, weight, bias}, "BatchNormBackward",
                   [shape, format, batch_stats, xc, mean, invstd, w, grad_x, grad_w, grad_b](const Tensor& g) {
                     const Tensor dy = g.contiguous(format);
                     // The per-channel sums: for the parameters' gradients, and for dx under batch statistics.
                     Tensor sum_dy, sum_dy_xmu;
                     if (grad_w || grad_b || (grad_x && batch_stats)) {
                       sum_dy = Tensor::empty({shape.c}, options_of(mean));
                       sum_dy_xmu = Tensor::empty({shape.c}, options_of(mean));
                       dispatch(
                           dy.device(),
                           [&] {
                             kernels::batch_norm_backward_reduce_cpu(shape, dy.data_ptr(), xc.data_ptr(),
                                                                     mean.data_ptr(), sum_dy.data_ptr(),
                                                                     sum_dy_xmu.data_ptr());
                           },
                           [&](auto stream) {
                             kernels::batch_norm_backward_reduce_cuda(stream, shape, dy.data_ptr(), xc.data_ptr(),
                                                                      mean.data_ptr(), sum_dy.data_ptr(),
                                                                      sum_dy_xmu.data_ptr());
                           });
                     }
                     Tensor dx;
                     if (grad_x) {
                       dx = Tensor::empty(xc.shape(), options_of(dy), format);
                       dispatch(
                           dy.device(),
                           [&] {
                             kernels::batch_norm_backward_elemt_cpu(shape, batch_stats, dy.data_ptr(), xc.data_ptr(),
                                                                    mean.data_ptr(), invstd.data_ptr(), data_or_null(w),
                                                                    data_or_null(sum_dy), data_or_null(sum_dy_xmu),
                                                                    dx.data_ptr());
                           },
                           [&](auto stream) {
                             kernels::batch_norm_backward_elemt_cuda(stream, shape, batch_stats, dy.data_ptr(),
                                                                     xc.data_ptr(), mean.data_ptr(), invstd.data_ptr(),
                                                                     data_or_null(w), data_or_null(sum_dy),
                                                                     data_or_null(sum_dy_xmu), dx.data_ptr());
                           });
                     }
                     return std::vector<Tensor>{dx, grad_w ? mul(sum_dy_xmu, invstd) : Tensor(),
                                                grad_b ? sum_dy : Tensor()};
                   });
  return channels_last ? y : detail::in_format_of(y, x);  // CUDA: NCHW kernels
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

namespace {

// rms_norm in one kernel each way (kernels/rms_norm.h); its node keeps x and one rstd per row.
Tensor rms_norm_fused(const Tensor& x, const Tensor& weight, double eps) {
  const int64_t d = x.size(-1), rows = x.numel() / d;
  const Tensor xc = x.detach().contiguous();
  const Tensor w = weight.defined() ? weight.detach().contiguous() : Tensor();
  Tensor y = Tensor::empty(x.shape(), options_of(x));
  Tensor rstd = Tensor::empty({rows}, options_of(x));
  dispatch(
      x.device(),
      [&] {
        kernels::rms_norm_forward_cpu(x.dtype(), rows, d, xc.data_ptr(), data_or_null(w), eps, y.data_ptr(),
                                      rstd.data_ptr());
      },
      [&](auto stream) {
        kernels::rms_norm_forward_cuda(stream, x.dtype(), rows, d, xc.data_ptr(), data_or_null(w), eps, y.data_ptr(),
                                       rstd.data_ptr());
      });
  const bool grad_x = x.requires_grad(), grad_w = weight.defined() && weight.requires_grad();
  autograd::record(y, {x, weight}, "RmsNormBackward", [xc, w, rstd, rows, d, grad_x, grad_w](const Tensor& g) {
    const Tensor gc = g.contiguous();
    Tensor dx = grad_x ? Tensor::empty(xc.shape(), options_of(xc)) : Tensor();
    Tensor dw = grad_w ? Tensor::empty({d}, options_of(xc)) : Tensor();
    dispatch(
        xc.device(),
        [&] {
          kernels::rms_norm_backward_cpu(xc.dtype(), rows, d, xc.data_ptr(), data_or_null(w), rstd.data_ptr(),
                                         gc.data_ptr(), data_or_null(dx), data_or_null(dw));
        },
        [&](auto stream) {
          const Tensor workspace =
              grad_w ? Tensor::empty({kernels::rms_norm_backward_cuda_workspace(rows, d)}, options_of(xc)) : Tensor();
          kernels::rms_norm_backward_cuda(stream, xc.dtype(), rows, d, xc.data_ptr(), data_or_null(w),
                                          rstd.data_ptr(), gc.data_ptr(), data_or_null(dx), data_or_null(dw),
                                          data_or_null(workspace));
        });
    return std::vector<Tensor>{dx, dw};
  });
  return y;
}

}  // namespace

// x: (*, D)  weight: (D)  ->  x's shape
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  detail::check_compute_dtype(x, "rms_norm");
  DPE_CHECK(x.dim() >= 1 && x.size(-1) > 0, "rms_norm: expected input (*, D) with D > 0, got ", shape_str(x.shape()));
  check_param(x, weight, {x.size(-1)}, "rms_norm", "weight");
  return rms_norm_fused(x, weight, eps);
}

}  // namespace dpe
