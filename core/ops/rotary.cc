// apply_rotary_emb (core/ops/rotary.h): kernels/rotary_emb.h, or composed from tensor ops where the tables
// require grad.
#include "core/ops/rotary.h"

#include <vector>

#include "core/autograd/function.h"
#include "core/copy.h"
#include "core/dispatch.h"
#include "core/kernels/rotary_emb.h"
#include "core/ops.h"
#include "core/ops/op_checks.h"

namespace dpe {

using detail::empty_strided_if_dense;
using detail::options_of;

namespace {

// The fused kernels. The node keeps the (T, d) tables and x's shape and strides, not x (the op is linear in x).
Tensor rotary_emb_fused(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const Tensor xs = detail::with_unit_last_stride(x.detach());
  const Tensor c = cos.contiguous(), s = sin.contiguous();
  Tensor y = Tensor::empty(x.shape(), options_of(x));
  dispatch(
      x.device(),
      [&] {
        kernels::rotary_emb_forward_cpu(x.dtype(), layout_of(xs), xs.data_ptr(), c.data_ptr(), s.data_ptr(),
                                        y.data_ptr());
      },
      [&](auto stream) {
        kernels::rotary_emb_forward_cuda(stream, x.dtype(), layout_of(xs), xs.data_ptr(), c.data_ptr(), s.data_ptr(),
                                         y.data_ptr());
      });
  autograd::record(y, {x}, "RotaryEmbBackward", [shape = xs.shape(), strides = xs.strides(), c, s](const Tensor& g) {
    const Tensor gc = g.contiguous();
    Tensor dx = empty_strided_if_dense(shape, strides, options_of(gc));
    dispatch(
        dx.device(),
        [&] {
          kernels::rotary_emb_backward_cpu(dx.dtype(), layout_of(dx), gc.data_ptr(), c.data_ptr(), s.data_ptr(),
                                           dx.data_ptr());
        },
        [&](auto stream) {
          kernels::rotary_emb_backward_cuda(stream, dx.dtype(), layout_of(dx), gc.data_ptr(), c.data_ptr(),
                                            s.data_ptr(), dx.data_ptr());
        });
    return std::vector<Tensor>{dx};
  });
  return y;
}

}  // namespace

// x: (..., T, d)  cos, sin: (T, d)  ->  x's shape
Tensor apply_rotary_emb(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  detail::check_compute_dtype(x, "apply_rotary_emb");
  DPE_CHECK(x.dim() >= 2, "apply_rotary_emb: expected x of shape (..., T, head_dim), got ", shape_str(x.shape()));
  const int64_t T = x.size(-2), d = x.size(-1);
  DPE_CHECK(d % 2 == 0, "apply_rotary_emb: head_dim must be even, got x ", shape_str(x.shape()));
  DPE_CHECK(cos.defined() && sin.defined() && cos.shape() == (Shape{T, d}) && sin.shape() == (Shape{T, d}),
            "apply_rotary_emb: x ", shape_str(x.shape()), " needs cos and sin of shape [", T, ", ", d, "], got ",
            cos.defined() ? shape_str(cos.shape()) : "undefined", " and ",
            sin.defined() ? shape_str(sin.shape()) : "undefined");
  detail::check_same_device_and_dtype(x, cos, "apply_rotary_emb (x and cos)");
  detail::check_same_device_and_dtype(x, sin, "apply_rotary_emb (x and sin)");
  if (!cos.requires_grad() && !sin.requires_grad() && x.numel() > 0) return rotary_emb_fused(x, cos, sin);
  // With differentiable tables autograd derives their gradients too. (No elements, and d = 0 with them, come
  // here as well: nothing to compute.)
  const int64_t half = d / 2;
  Tensor rotated = cat({neg(x.narrow(-1, half, half)), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

}  // namespace dpe
