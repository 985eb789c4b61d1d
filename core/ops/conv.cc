// conv2d: input checks, dispatch to the conv kernels (core/kernels/conv.h), and backward. Under autocast
// (core/amp/autocast.h) the kernels read 16-bit casts of x, the weight and dy, and write float32. On CPU x and
// dy go in as float32 and the kernel rounds them while it reorders them for oneDNN (Conv2dShape's
// f32_activations): the same bfloat16 values, one pass over each instead of two.
#include "core/ops/conv.h"

#include <utility>

#include "core/amp/autocast.h"
#include "core/autograd/function.h"
#include "core/dispatch.h"
#include "core/kernels/batch_norm.h"
#include "core/kernels/conv.h"
#include "core/kernels/conv_pool.h"
#include "core/ops.h"
#include "core/ops/op_checks.h"
#include "core/ops/pool.h"

namespace dpe {

using detail::check_compute_dtype;
using detail::data_or_null;
using detail::options_of;

namespace {

// The checked kernel shape of conv2d(x (N, C_in, H, W), weight (C_out, C_in/groups, kH, kW)).
kernels::Conv2dShape conv_shape(const Tensor& x, const Tensor& weight, std::array<int64_t, 2> stride,
                                std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation, int64_t groups) {
  kernels::Conv2dShape s;
  s.dtype = x.dtype();
  s.n = x.size(0);
  s.c_in = x.size(1);
  s.h = x.size(2);
  s.w = x.size(3);
  s.c_out = weight.size(0);
  s.kh = weight.size(2);
  s.kw = weight.size(3);
  s.stride_h = stride[0];
  s.stride_w = stride[1];
  s.pad_h = padding[0];
  s.pad_w = padding[1];
  s.dil_h = dilation[0];
  s.dil_w = dilation[1];
  s.groups = groups;
  return s;
}

MemoryFormat activation_format(const kernels::Conv2dShape& s) {
  return s.channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
}

// The gradients conv2d's backward makes from dy.
struct ConvGrads {
  Tensor dx, dw, db;
};

// dy: (N, C_out, H_out, W_out)  x: (N, C_in, H, W)  weight: (C_out, C_in/g, kH, kW)
//   -> dx: (N, C_in, H, W) if grad_x, dw: (C_out, C_in/g, kH, kW) if grad_w, db: (C_out) if grad_b; x is read only
//   for dw, weight only for dx. On CPU one call makes dx and dw (dy reordered once for oneDNN), and db too, from
//   the dy the products read (Note [The bias gradient in backward weights]); otherwise db = sum(dy over N,
//   H_out, W_out), of dy_f32 on CUDA (kernels::channel_sum_cuda) and of dy rounded to bfloat16 under CPU
//   autocast.
// dy_f32: the float32 gradient (db is summed from it); dy: what the products read (its 16-bit cast under
// autocast).
ConvGrads conv2d_backward(const kernels::Conv2dShape& s, const Tensor& dy_f32, const Tensor& dy, const Tensor& x,
                          const Tensor& weight, bool grad_x, bool grad_w, bool grad_b) {
  const TensorOptions out = options_of(dy).with_dtype(kernels::conv2d_output_dtype(s.dtype));
  ConvGrads g;
  g.dx = grad_x ? Tensor::empty({s.n, s.c_in, s.h, s.w}, out, activation_format(s)) : Tensor();
  g.dw = grad_w ? Tensor::empty({s.c_out, s.c_in / s.groups, s.kh, s.kw}, out) : Tensor();
  const bool fused_db =
      grad_b && grad_w && dy.device().is_cpu() && (s.dtype == DType::Float32 || s.f32_activations);
  if (fused_db) g.db = Tensor::empty({s.c_out}, out);
  dispatch(
      dy.device(),
      [&] {
        kernels::conv2d_backward_cpu(s, data_or_null(x), data_or_null(weight), dy.data_ptr(), data_or_null(g.dx),
                                     data_or_null(g.dw), data_or_null(g.db));
      },
      [&](auto stream) {
        const int device = dy.device().index;
        if (grad_x) {
          kernels::conv2d_backward_data_cuda(stream, device, s, dy.data_ptr(), weight.data_ptr(), g.dx.data_ptr());
        }
        if (grad_w) {
          kernels::conv2d_backward_weight_cuda(stream, device, s, x.data_ptr(), dy.data_ptr(), g.dw.data_ptr());
        }
      });
  if (grad_b && !fused_db && dy_f32.device().is_cuda() && dy_f32.numel() > 0 && dy_f32.is_contiguous()) {
    // One per-channel sum on the batch-norm pieces where sum() over {0, 2, 3} makes two slower reductions.
    g.db = Tensor::empty({s.c_out}, options_of(dy_f32));
    const kernels::BatchNormShape shape{dy_f32.dtype(), s.n, s.c_out, s.h_out() * s.w_out()};
    dispatch(
        dy_f32.device(), [] { DPE_INTERNAL_ASSERT(false, "conv2d: the CPU's bias gradient is sum()"); },
        [&](auto stream) { kernels::channel_sum_cuda(stream, shape, dy_f32.data_ptr(), g.db.data_ptr()); });
  } else if (grad_b && !fused_db) {
    // A frozen weight under CPU autocast: the same sum of the rounded dy as the fused pass makes.
    const Tensor summed = s.f32_activations ? dy_f32.to(s.dtype).to(DType::Float32) : dy_f32;
    g.db = sum(summed, std::vector<int64_t>{0, 2, 3});
  }
  return g;
}

// conv2d's argument checks, for x (N, C_in, H, W) or unbatched (C_in, H, W).
void check_conv2d_args(const Tensor& x, const Tensor& weight, const Tensor& bias, std::array<int64_t, 2> stride,
                       std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation, int64_t groups) {
  detail::check_same_device_and_dtype(x, weight, "conv2d");
  check_compute_dtype(x, "conv2d");
  if (bias.defined()) detail::check_same_device_and_dtype(x, bias, "conv2d");
  DPE_CHECK(weight.dim() == 4, "conv2d: expected weight (C_out, C_in/groups, kH, kW), got ",
            shape_str(weight.shape()));
  DPE_CHECK(groups > 0, "conv2d: groups must be positive, got ", groups);
  DPE_CHECK(stride[0] > 0 && stride[1] > 0, "conv2d: stride must be positive, got (", stride[0], ", ", stride[1], ")");
  DPE_CHECK(dilation[0] > 0 && dilation[1] > 0, "conv2d: dilation must be positive, got (", dilation[0], ", ",
            dilation[1], ")");
  DPE_CHECK(padding[0] >= 0 && padding[1] >= 0, "conv2d: padding must be non-negative, got (", padding[0], ", ",
            padding[1], ")");
  const int64_t c_out = weight.size(0), c_in = weight.size(1) * groups;
  DPE_CHECK(c_out > 0 && weight.size(1) > 0 && weight.size(2) > 0 && weight.size(3) > 0,
            "conv2d: weight has an empty dimension: ", shape_str(weight.shape()));
  DPE_CHECK(c_out % groups == 0, "conv2d: C_out=", c_out, " (weight ", shape_str(weight.shape()),
            ") is not divisible by groups=", groups);
  if (x.dim() == 3) {
    DPE_CHECK(x.size(0) == c_in, "conv2d: expected input (C_in=", c_in, ", H, W), got ", shape_str(x.shape()));
  } else {
    DPE_CHECK(x.dim() == 4 && x.size(1) == c_in, "conv2d: expected input (N, C_in=", c_in, ", H, W), got ",
              shape_str(x.shape()), groups > 1 ? " (C_in = weight.size(1) * groups)" : "");
    if (bias.defined()) {
      DPE_CHECK(bias.dim() == 1 && bias.size(0) == c_out, "conv2d: expected bias (C_out=", c_out, "), got ",
                shape_str(bias.shape()));
    }
    const int64_t kh_eff = dilation[0] * (weight.size(2) - 1) + 1, kw_eff = dilation[1] * (weight.size(3) - 1) + 1;
    DPE_CHECK(x.size(2) > 0 && x.size(3) > 0 && x.size(2) + 2 * padding[0] >= kh_eff &&
                  x.size(3) + 2 * padding[1] >= kw_eff,
              "conv2d: input ", shape_str(x.shape()), " padded by (", padding[0], ", ", padding[1],
              ") is smaller than the dilated kernel (", kh_eff, ", ", kw_eff, ")");
  }
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, std::array<int64_t, 2> stride,
              std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation, int64_t groups) {
  check_conv2d_args(x, weight, bias, stride, padding, dilation, groups);
  // Unbatched (C_in, H, W): a batch of one, through differentiable views.
  if (x.dim() == 3) return conv2d(x.unsqueeze(0), weight, bias, stride, padding, dilation, groups).squeeze(0);
  kernels::Conv2dShape s = conv_shape(x, weight, stride, padding, dilation, groups);
  const std::optional<DType> lowp =
      x.dtype() == DType::Float32 ? amp::lower_precision_dtype(x.device()) : std::nullopt;
  // Note [Memory formats]: a channels-last input stays channels last on CPU (oneDNN's own layout; float64's
  // im2col and cuDNN get NCHW), and so do y and dx.
  s.channels_last = x.device().is_cpu() && x.dtype() != DType::Float64 &&
                    x.suggest_memory_format() == MemoryFormat::ChannelsLast;
  const MemoryFormat format = activation_format(s);
  Tensor xc = x.detach().contiguous(format), wc = weight.detach().contiguous();
  if (lowp) {
    s.dtype = *lowp;
    s.f32_activations = x.device().is_cpu();
    if (!s.f32_activations) xc = amp::cast_operand(xc, *lowp);
    wc = amp::cast_operand(weight, *lowp);  // a parameter: from the cast cache
  }
  Tensor bc = bias.defined() ? bias.detach().contiguous() : Tensor();
  Tensor y = Tensor::empty({s.n, s.c_out, s.h_out(), s.w_out()}, options_of(x), format);
  const void* b_ptr = data_or_null(bc);
  dispatch(
      x.device(), [&] { kernels::conv2d_forward_cpu(s, xc.data_ptr(), wc.data_ptr(), b_ptr, y.data_ptr()); },
      [&](auto stream) {
        kernels::conv2d_forward_cuda(stream, x.device().index, s, xc.data_ptr(), wc.data_ptr(), b_ptr, y.data_ptr());
      });

  const bool grad_x = x.requires_grad(), grad_w = weight.requires_grad();
  const bool grad_b = bias.defined() && bias.requires_grad();
  // Saved only where a gradient needs them: dx needs the weight, dw needs the input.
  Tensor saved_x = grad_w ? xc : Tensor(), saved_w = grad_x ? wc : Tensor();
  autograd::record(y, {x, weight, bias}, "Conv2dBackward",
                   [s, saved_x, saved_w, grad_x, grad_w, grad_b, lowp](const Tensor& g) -> std::vector<Tensor> {
                     Tensor dy = g.contiguous(activation_format(s));
                     Tensor dy_op = lowp && !s.f32_activations ? amp::cast_operand(dy, *lowp) : dy;
                     ConvGrads grads = conv2d_backward(s, dy, dy_op, saved_x, saved_w, grad_x, grad_w, grad_b);
                     return {grads.dx, grads.dw, grads.db};
                   });
  return s.channels_last ? y : detail::in_format_of(y, x);  // float64 and CUDA: NCHW kernels
}

Tensor conv2d_relu_max_pool2d(const Tensor& x, const Tensor& weight, const Tensor& bias, std::array<int64_t, 2> stride,
                              std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation, int64_t groups) {
  check_conv2d_args(x, weight, bias, stride, padding, dilation, groups);
  // x's gradient and autocast's 16-bit operands are the composition's.
  const bool candidate = x.dim() == 4 && x.device().is_cpu() && !x.requires_grad() &&
                         !(x.dtype() == DType::Float32 && amp::lower_precision_dtype(x.device()));
  kernels::Conv2dShape s;
  if (candidate) {
    s = conv_shape(x, weight, stride, padding, dilation, groups);
    s.channels_last = x.suggest_memory_format() == MemoryFormat::ChannelsLast;
  }
  if (!candidate || !kernels::conv2d_relu_max_pool2d_applies(s)) {
    return max_pool2d_relu(conv2d(x, weight, bias, stride, padding, dilation, groups), {2, 2}, {2, 2});
  }
  const MemoryFormat format = activation_format(s);
  Tensor xc = x.detach().contiguous(format), wc = weight.detach().contiguous();
  Tensor bc = bias.defined() ? bias.detach().contiguous() : Tensor();
  const int64_t h_p = kernels::conv_pool_h(s), w_p = kernels::conv_pool_w(s);
  Tensor y = Tensor::empty({s.n, s.c_out, h_p, w_p}, options_of(x), format);
  Tensor codes = Tensor::empty({s.n, h_p, w_p, s.c_out}, options_of(x).with_dtype(DType::UInt8));
  kernels::conv2d_relu_max_pool2d_cpu(s, xc.data<float>(), wc.data<float>(),
                                      bc.defined() ? bc.data<float>() : nullptr, y.data<float>(), codes.data<uint8_t>());
  const bool grad_w = weight.requires_grad(), grad_b = bias.defined() && bias.requires_grad();
  Tensor saved_x = grad_w ? xc : Tensor();
  autograd::record(y, {x, weight, bias}, "ConvReluMaxPoolBackward",
                   [s, saved_x, codes, grad_w, grad_b](const Tensor& g) -> std::vector<Tensor> {
                     const Tensor dy = g.contiguous(activation_format(s));
                     const TensorOptions out = options_of(dy);
                     Tensor dw = grad_w ? Tensor::empty({s.c_out, s.c_in, s.kh, s.kw}, out) : Tensor();
                     Tensor db = grad_b ? Tensor::empty({s.c_out}, out) : Tensor();
                     kernels::conv2d_relu_max_pool2d_backward_cpu(
                         s, grad_w ? saved_x.data<float>() : nullptr, dy.data<float>(), codes.data<uint8_t>(),
                         grad_w ? dw.data<float>() : nullptr, grad_b ? db.data<float>() : nullptr);
                     return {Tensor(), dw, db};
                   });
  return y;
}

}  // namespace dpe
