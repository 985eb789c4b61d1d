// softmax / log_softmax over one dimension, with backward from the saved output.
#include "core/autograd/function.h"
#include "core/dispatch.h"
#include "core/kernels/softmax.h"
#include "core/ops.h"
#include "core/ops/axis.h"
#include "core/ops/op_checks.h"

namespace dpe {

using kernels::SoftmaxKind;
using detail::Axis;
using detail::axis_of;

namespace {

Tensor softmax_backward(SoftmaxKind kind, const Tensor& y, const Tensor& dy, int64_t d) {
  Axis axis = axis_of(y.shape(), d);
  Tensor dyc = dy.contiguous();
  Tensor dx = empty_like(y);
  dispatch(
      y.device(),
      [&] {
        kernels::softmax_backward_cpu(kind, y.dtype(), axis.outer, axis.size, axis.inner, y.data_ptr(),
                                      dyc.data_ptr(), dx.data_ptr());
      },
      [&](auto stream) {
        kernels::softmax_backward_cuda(stream, kind, y.dtype(), axis.outer, axis.size, axis.inner, y.data_ptr(),
                                       dyc.data_ptr(), dx.data_ptr());
      });
  return dx;
}

Tensor softmax_impl(SoftmaxKind kind, const Tensor& x, int64_t dim, const char* name) {
  detail::check_compute_dtype(x, name);
  int64_t d = normalize_dim(dim, x.dim(), name);
  Tensor in = x.contiguous();
  Tensor y = empty_like(x);
  if (x.numel() > 0) {
    Axis axis = axis_of(x.shape(), d);
    dispatch(
        x.device(),
        [&] { kernels::softmax_cpu(kind, x.dtype(), axis.outer, axis.size, axis.inner, in.data_ptr(), y.data_ptr()); },
        [&](auto stream) {
          kernels::softmax_cuda(stream, kind, x.dtype(), axis.outer, axis.size, axis.inner, in.data_ptr(),
                                y.data_ptr());
        });
  }
  Tensor saved = y.detach();
  const char* node = kind == SoftmaxKind::Softmax ? "SoftmaxBackward" : "LogSoftmaxBackward";
  autograd::record(y, {x}, node, [kind, saved, d](const Tensor& g) -> std::vector<Tensor> {
    return {softmax_backward(kind, saved, g, d)};
  });
  return y;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_impl(SoftmaxKind::Softmax, x, dim, "softmax"); }
Tensor log_softmax(const Tensor& x, int64_t dim) {
  return softmax_impl(SoftmaxKind::LogSoftmax, x, dim, "log_softmax");
}

}  // namespace dpe
