// Pooling ops: input checks, dispatch to the pool kernels (core/kernels/pool.h), and backward.
#include "core/ops/pool.h"

#include "core/autograd/function.h"
#include "core/dispatch.h"
#include "core/kernels/pool.h"
#include "core/ops/op_checks.h"

namespace dpe {

using kernels::Pool2dShape;
using detail::check_compute_dtype;
using detail::options_of;

namespace {

// Checks x is (N, C, H, W) or (C, H, W) with non-empty H, W, and returns its pool shape without the output.
Pool2dShape input_shape(const Tensor& x, const char* op) {
  check_compute_dtype(x, op);
  DPE_CHECK((x.dim() == 3 || x.dim() == 4) && x.size(-1) > 0 && x.size(-2) > 0, op,
            ": expected input (N, C, H, W) or (C, H, W) with H, W > 0, got ", shape_str(x.shape()));
  Pool2dShape s;
  s.dtype = x.dtype();
  s.planes = x.numel() / (x.size(-1) * x.size(-2));
  s.h = x.size(-2);
  s.w = x.size(-1);
  return s;
}

// The shape of a window pool, every argument checked with the values in the message.
Pool2dShape window_shape(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                         std::array<int64_t, 2> padding, const char* op) {
  Pool2dShape s = input_shape(x, op);
  DPE_CHECK(kernel[0] > 0 && kernel[1] > 0, op, ": kernel size must be positive, got (", kernel[0], ", ", kernel[1],
            ")");
  DPE_CHECK(stride[0] > 0 && stride[1] > 0, op, ": stride must be positive, got (", stride[0], ", ", stride[1], ")");
  DPE_CHECK(padding[0] >= 0 && padding[1] >= 0 && 2 * padding[0] <= kernel[0] && 2 * padding[1] <= kernel[1], op,
            ": padding (", padding[0], ", ", padding[1], ") must be >= 0 and at most half the kernel size (",
            kernel[0], ", ", kernel[1], ")");
  s.kh = kernel[0];
  s.kw = kernel[1];
  s.stride_h = stride[0];
  s.stride_w = stride[1];
  s.pad_h = padding[0];
  s.pad_w = padding[1];
  DPE_CHECK(s.h + 2 * s.pad_h >= s.kh && s.w + 2 * s.pad_w >= s.kw, op, ": input ", shape_str(x.shape()),
            " padded by (", s.pad_h, ", ", s.pad_w, ") is smaller than the kernel (", s.kh, ", ", s.kw, ")");
  s.h_out = kernels::pool_out_size(s.h, s.kh, s.stride_h, s.pad_h);
  s.w_out = kernels::pool_out_size(s.w, s.kw, s.stride_w, s.pad_w);
  return s;
}

// x's shape with the last two dims replaced by the pool's output size.
Shape output_shape(const Tensor& x, const Pool2dShape& s) {
  Shape out = x.shape();
  out[out.size() - 2] = s.h_out;
  out[out.size() - 1] = s.w_out;
  return out;
}

// dx (x's shape) from dy (y's shape), by one of the backward kernels.
// dx and the dy the kernel reads are in `format`.
template <typename Cpu, typename Cuda>
Tensor pool_backward(const Shape& x_shape, const Tensor& dy, const Cpu& cpu, const Cuda& cuda,
                     MemoryFormat format = MemoryFormat::Contiguous) {
  Tensor dyc = dy.contiguous(format);
  Tensor dx = Tensor::empty(x_shape, options_of(dy), format);
  if (dx.numel() > 0) {
    dispatch(
        dy.device(), [&] { cpu(dyc.data_ptr(), dx.data_ptr()); },
        [&](auto stream) { cuda(stream, dyc.data_ptr(), dx.data_ptr()); });
  }
  return dx;
}

Tensor avg_pool_backward(const Pool2dShape& s, const Shape& x_shape, const Tensor& dy) {
  return pool_backward(
      x_shape, dy, [&](const void* g, void* dx) { kernels::avg_pool2d_backward_cpu(s, g, dx); },
      [&](auto stream, const void* g, void* dx) {
        kernels::avg_pool2d_backward_cuda(stream, s, g, dx);
      });
}

Tensor adaptive_backward(const Pool2dShape& s, const Shape& x_shape, const Tensor& dy) {
  return pool_backward(
      x_shape, dy, [&](const void* g, void* dx) { kernels::adaptive_avg_pool2d_backward_cpu(s, g, dx); },
      [&](auto stream, const void* g, void* dx) {
        kernels::adaptive_avg_pool2d_backward_cuda(stream, s, g, dx);
      });
}

// max_pool2d of a CPU MaxPool2d(2) on float32: the backward reads uint8 window codes, not int64 indices
// (Note [Window codes], core/kernels/pool.h). A channels-last x gives a channels-last y and dx (Note [Memory
// formats], core/tensor.h).
Tensor max_pool2d_2x2(const Tensor& x, Pool2dShape s) {
  const MemoryFormat format = x.dim() == 4 ? x.suggest_memory_format() : MemoryFormat::Contiguous;
  s.channels_last = format == MemoryFormat::ChannelsLast;
  s.c = s.channels_last ? x.size(1) : 1;
  Tensor xc = x.detach().contiguous(format);
  const Shape out_shape = output_shape(x, s);
  Tensor y = Tensor::empty(out_shape, options_of(x), format);
  Tensor codes = Tensor::empty(out_shape, options_of(x).with_dtype(DType::UInt8), format);
  if (y.numel() > 0) kernels::max_pool2d_2x2_cpu(s, xc.data_ptr(), y.data_ptr(), codes.data<uint8_t>());
  const Shape x_shape = x.shape();
  autograd::record(y, {x}, "MaxPool2dBackward", [s, x_shape, codes, format](const Tensor& g) -> std::vector<Tensor> {
    return {pool_backward(
        x_shape, g,
        [&](const void* dy, void* dx) { kernels::max_pool2d_2x2_backward_cpu(s, dy, codes.data<uint8_t>(), dx); },
        [&](auto, const void*, void*) { DPE_INTERNAL_ASSERT(false, "window codes are CPU only"); }, format)};
  });
  return y;
}

// max_pool2d_with_indices on a checked shape.
ValuesIndices max_pool2d_with_indices(const Tensor& x, const Pool2dShape& s) {
  Tensor xc = x.detach().contiguous();
  const Shape out_shape = output_shape(x, s);
  Tensor y = Tensor::empty(out_shape, options_of(x));
  Tensor indices = Tensor::empty(out_shape, options_of(x).with_dtype(DType::Int64));
  if (y.numel() > 0) {
    dispatch(
        x.device(), [&] { kernels::max_pool2d_cpu(s, xc.data_ptr(), y.data_ptr(), indices.data<int64_t>()); },
        [&](auto stream) {
          kernels::max_pool2d_cuda(stream, s, xc.data_ptr(), y.data_ptr(), indices.data<int64_t>());
        });
  }
  const Shape x_shape = x.shape();
  autograd::record(y, {x}, "MaxPool2dBackward", [s, x_shape, indices](const Tensor& g) -> std::vector<Tensor> {
    return {pool_backward(
        x_shape, g,
        [&](const void* dy, void* dx) { kernels::max_pool2d_backward_cpu(s, dy, indices.data<int64_t>(), dx); },
        [&](auto stream, const void* dy, void* dx) {
          kernels::max_pool2d_backward_cuda(stream, s, dy, indices.data<int64_t>(), dx);
        })};
  });
  return {y, indices};
}

}  // namespace

ValuesIndices max_pool2d_with_indices(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                                      std::array<int64_t, 2> padding) {
  ValuesIndices r = max_pool2d_with_indices(x, window_shape(x, kernel, stride, padding, "max_pool2d"));
  r.values = detail::in_format_of(r.values, x);
  return r;
}

Tensor max_pool2d(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                  std::array<int64_t, 2> padding) {
  const Pool2dShape s = window_shape(x, kernel, stride, padding, "max_pool2d");
  if (x.device().is_cpu() && kernels::max_pool2d_2x2_applies(s)) return max_pool2d_2x2(x, s);
  return detail::in_format_of(max_pool2d_with_indices(x, s).values, x);
}

Tensor max_pool2d(const Tensor& x, std::array<int64_t, 2> kernel) { return max_pool2d(x, kernel, kernel); }

Tensor max_pool2d_relu(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                       std::array<int64_t, 2> padding) {
  Pool2dShape s = window_shape(x, kernel, stride, padding, "max_pool2d");
  if (x.device().is_cuda()) {
    // The CUDA max-pool kernels take the relu too: one launch each way where the two ops take two.
    s.relu = true;
    return detail::in_format_of(max_pool2d_with_indices(x, s).values, x);
  }
  if (!kernels::max_pool2d_2x2_applies(s)) return relu(max_pool2d(x, kernel, stride, padding));
  s.relu = true;
  return max_pool2d_2x2(x, s);
}

Tensor avg_pool2d(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                  std::array<int64_t, 2> padding) {
  const Pool2dShape s = window_shape(x, kernel, stride, padding, "avg_pool2d");
  Tensor xc = x.detach().contiguous();
  Tensor y = Tensor::empty(output_shape(x, s), options_of(x));
  if (y.numel() > 0) {
    dispatch(
        x.device(), [&] { kernels::avg_pool2d_cpu(s, xc.data_ptr(), y.data_ptr()); },
        [&](auto stream) { kernels::avg_pool2d_cuda(stream, s, xc.data_ptr(), y.data_ptr()); });
  }
  const Shape x_shape = x.shape();
  autograd::record(y, {x}, "AvgPool2dBackward", [s, x_shape](const Tensor& g) -> std::vector<Tensor> {
    return {avg_pool_backward(s, x_shape, g)};
  });
  return detail::in_format_of(y, x);
}

Tensor avg_pool2d(const Tensor& x, std::array<int64_t, 2> kernel) { return avg_pool2d(x, kernel, kernel); }

Tensor adaptive_avg_pool2d(const Tensor& x, std::array<int64_t, 2> output_size) {
  Pool2dShape s = input_shape(x, "adaptive_avg_pool2d");
  DPE_CHECK(output_size[0] > 0 && output_size[1] > 0, "adaptive_avg_pool2d: output_size must be positive, got (",
            output_size[0], ", ", output_size[1], ")");
  s.h_out = output_size[0];
  s.w_out = output_size[1];
  Tensor xc = x.detach().contiguous();
  Tensor y = Tensor::empty(output_shape(x, s), options_of(x));
  if (y.numel() > 0) {
    dispatch(
        x.device(), [&] { kernels::adaptive_avg_pool2d_cpu(s, xc.data_ptr(), y.data_ptr()); },
        [&](auto stream) { kernels::adaptive_avg_pool2d_cuda(stream, s, xc.data_ptr(), y.data_ptr()); });
  }
  const Shape x_shape = x.shape();
  autograd::record(y, {x}, "AdaptiveAvgPool2dBackward", [s, x_shape](const Tensor& g) -> std::vector<Tensor> {
    return {adaptive_backward(s, x_shape, g)};
  });
  return detail::in_format_of(y, x);
}

}  // namespace dpe
