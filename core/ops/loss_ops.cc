// nll_per_position: checks, the nll kernels (core/kernels/nll.h) and the backward.
#include "core/ops/loss_ops.h"

#include <vector>

#include "core/autograd/function.h"
#include "core/dispatch.h"
#include "core/kernels/nll.h"
#include "core/kernels/softmax.h"
#include "core/ops.h"
#include "core/ops/op_checks.h"

namespace dpe {
namespace {

struct Axes {
  int64_t outer = 1, classes = 1, inner = 1;
};

// log_probs viewed as (N, C, inner = d1 * d2 * ...).
Axes axes_of(const Tensor& log_probs) {
  Axes a;
  a.outer = log_probs.size(0);
  a.classes = log_probs.size(1);
  for (int64_t d = 2; d < log_probs.dim(); ++d) a.inner *= log_probs.size(d);
  return a;
}

// The contract of core/kernels/nll.h for CUDA targets: checked here, on a host copy, before the launch.
void check_targets_on_host(const Tensor& target, int64_t classes, int64_t ignore_index, const char* op) {
  for (int64_t t : target.to_vector<int64_t>()) {
    DPE_CHECK(t == ignore_index || (t >= 0 && t < classes), op, ": target ", t, " is out of bounds for ", classes,
              " classes (expected a value in [0, ", classes, ") or ignore_index ", ignore_index, ")");
  }
}

// grad_loss, target: (N, d1, ...) contiguous  ->  grad_log_probs: log_probs' shape
Tensor nll_backward(const Tensor& grad_loss, const Tensor& target, const Shape& log_probs_shape,
                    int64_t ignore_index) {
  Tensor g = grad_loss.contiguous();
  Tensor dx = Tensor::empty(log_probs_shape, detail::options_of(g));
  Axes a;
  a.outer = log_probs_shape[0];
  a.classes = log_probs_shape[1];
  for (size_t d = 2; d < log_probs_shape.size(); ++d) a.inner *= log_probs_shape[d];
  dispatch(
      dx.device(),
      [&] {
        kernels::nll_backward_cpu(dx.dtype(), a.outer, a.classes, a.inner, target.data<int64_t>(), ignore_index,
                                  g.data_ptr(), dx.data_ptr());
      },
      [&](auto stream) {
        kernels::nll_backward_cuda(stream, dx.dtype(), a.outer, a.classes, a.inner, target.data<int64_t>(),
                                   ignore_index, g.data_ptr(), dx.data_ptr());
      });
  return dx;
}

// The arguments, checked against loss_ops.h's contract (CUDA targets on a host copy), as the kernels take them.
struct NllArguments {
  Shape positions;  // the target's shape, which is also the per-position losses'
  Axes axes;
  Tensor log_probs, target;  // contiguous
};

NllArguments checked_nll_arguments(const Tensor& log_probs, const Tensor& target, int64_t ignore_index,
                                   const char* op) {
  detail::check_compute_dtype(log_probs, op);
  detail::check_defined(target, op);
  DPE_CHECK(target.dtype() == DType::Int64, op, ": target must be int64 class indices, got ", target.dtype());
  DPE_CHECK(log_probs.device() == target.device(), op, ": input is on ", log_probs.device(), " but target is on ",
            target.device(), "; move one with to()");
  DPE_CHECK(log_probs.dim() >= 2, op, ": input ", shape_str(log_probs.shape()),
            " must have at least 2 dimensions (N, C, d1, ...)");
  Shape expected{log_probs.size(0)};
  for (int64_t d = 2; d < log_probs.dim(); ++d) expected.push_back(log_probs.size(d));
  DPE_CHECK(target.shape() == expected, op, ": target ", shape_str(target.shape()), " does not match input ",
            shape_str(log_probs.shape()), " (expected target ", shape_str(expected), ")");
  NllArguments args{expected, axes_of(log_probs), log_probs.contiguous(), target.contiguous()};
  if (args.target.device().is_cuda()) check_targets_on_host(args.target, args.axes.classes, ignore_index, op);
  return args;
}

}  // namespace

NllPerPosition nll_per_position(const Tensor& log_probs, const Tensor& target, int64_t ignore_index,
                                const char* op) {
  const NllArguments args = checked_nll_arguments(log_probs, target, ignore_index, op);
  const Axes& a = args.axes;
  const Tensor &lp = args.log_probs, &tc = args.target;
  NllPerPosition out;
  out.loss = Tensor::empty(args.positions, detail::options_of(log_probs));
  out.valid = Tensor::empty(args.positions, detail::options_of(log_probs));
  if (out.loss.numel() > 0) {
    dispatch(
        lp.device(),
        [&] {
          kernels::nll_forward_cpu(lp.dtype(), a.outer, a.classes, a.inner, lp.data_ptr(), tc.data<int64_t>(),
                                   ignore_index, out.loss.data_ptr(), out.valid.data_ptr());
        },
        [&](auto stream) {
          kernels::nll_forward_cuda(stream, lp.dtype(), a.outer, a.classes, a.inner, lp.data_ptr(),
                                    tc.data<int64_t>(), ignore_index, out.loss.data_ptr(), out.valid.data_ptr());
        });
  }
  Tensor saved_target = tc.detach();
  Shape shape = log_probs.shape();
  autograd::record(out.loss, {log_probs}, "NllLossBackward",
                   [saved_target, shape, ignore_index](const Tensor& g) -> std::vector<Tensor> {
                     return {nll_backward(g, saved_target, shape, ignore_index)};
                   });
  return out;
}

Tensor nll_loss_mean(const Tensor& log_probs, const Tensor& target, int64_t ignore_index, const char* op) {
  if (!log_probs.defined() || !log_probs.device().is_cuda()) {
    NllPerPosition nll = nll_per_position(log_probs, target, ignore_index, op);
    return div(sum(nll.loss), sum(nll.valid));
  }
  const NllArguments args = checked_nll_arguments(log_probs, target, ignore_index, op);
  const Axes a = args.axes;
  const Tensor &lp = args.log_probs, &tc = args.target;
  Tensor out = Tensor::empty({}, detail::options_of(log_probs));
  Tensor count = Tensor::empty({}, detail::options_of(log_probs));
  dispatch(
      lp.device(), [] { DPE_INTERNAL_ASSERT(false, "nll_loss_mean: the CPU composes"); },
      [&](auto stream) {
        kernels::nll_mean_forward_cuda(stream, lp.dtype(), a.outer, a.classes, a.inner, lp.data_ptr(),
                                       tc.data<int64_t>(), ignore_index, out.data_ptr(), count.data_ptr());
      });
  Tensor saved_target = tc.detach();
  Shape shape = log_probs.shape();
  autograd::record(out, {log_probs}, "NllLossBackward",
                   [saved_target, count, shape, a, ignore_index](const Tensor& g) -> std::vector<Tensor> {
                     Tensor gc = g.contiguous();
                     Tensor dx = Tensor::empty(shape, detail::options_of(gc));
                     dispatch(
                         dx.device(), [] { DPE_INTERNAL_ASSERT(false, "nll_loss_mean: the CPU composes"); },
                         [&](auto stream) {
                           kernels::nll_mean_backward_cuda(stream, dx.dtype(), a.outer, a.classes, a.inner,
                                                           saved_target.data<int64_t>(), ignore_index,
                                                           gc.data_ptr(), count.data_ptr(), dx.data_ptr());
                         });
                     return {dx};
                   });
  return out;
}

namespace {

// cross_entropy_mean on a CUDA device: kernels/softmax.h's two launches forward and one backward; the node keeps
// the logits, three numbers per row and the count. x: the logits made contiguous.
Tensor cross_entropy_mean_cuda(const Tensor& logits, const Tensor& x, const Tensor& target, int64_t ignore_index) {
  const int64_t rows = x.size(0), classes = x.size(1);
  Tensor out = Tensor::empty({}, detail::options_of(x));
  Tensor count = Tensor::empty({}, detail::options_of(x));
  Tensor stats = Tensor::empty({rows, 3}, detail::options_of(x));
  dispatch(
      x.device(), [] { DPE_INTERNAL_ASSERT(false, "cross_entropy_mean_cuda on a CPU device"); },
      [&](auto stream) {
        kernels::cross_entropy_mean_forward_cuda(stream, x.dtype(), rows, classes, x.data_ptr(), target.data<int64_t>(),
                                                 ignore_index, out.data_ptr(), count.data_ptr(), stats.data_ptr());
      });
  Tensor saved_x = x.detach(), saved_target = target.detach();
  autograd::record(out, {logits}, "CrossEntropyBackward",
                   [saved_x, saved_target, stats, count, ignore_index](const Tensor& g) -> std::vector<Tensor> {
                     Tensor gc = g.contiguous();
                     Tensor dx = Tensor::empty(saved_x.shape(), detail::options_of(saved_x));
                     dispatch(
                         dx.device(), [] { DPE_INTERNAL_ASSERT(false, "cross_entropy_mean_cuda on a CPU device"); },
                         [&](auto stream) {
                           kernels::cross_entropy_mean_backward_cuda(
                               stream, dx.dtype(), saved_x.size(0), saved_x.size(1), saved_x.data_ptr(),
                               stats.data_ptr(), saved_target.data<int64_t>(), ignore_index, gc.data_ptr(),
                               count.data_ptr(), dx.data_ptr());
                         });
                     return {dx};
                   });
  return out;
}

}  // namespace

Tensor cross_entropy_mean(const Tensor& logits, const Tensor& target, int64_t ignore_index) {
  const char* op = "cross_entropy";
  const bool fused = logits.defined() && logits.dim() == 2 &&
                     (logits.dtype() == DType::Float32 || logits.dtype() == DType::Float64);
  if (!fused) return nll_loss_mean(log_softmax(logits, 1), target, ignore_index, op);
  const NllArguments args = checked_nll_arguments(logits, target, ignore_index, op);  // checks CUDA targets
  const Tensor &x = args.log_probs, &tc = args.target;
  if (x.device().is_cuda()) return cross_entropy_mean_cuda(logits, x, tc, ignore_index);
  const int64_t rows = args.axes.outer, classes = args.axes.classes;
  check_targets_on_host(tc, classes, ignore_index, op);
  Tensor loss = Tensor::empty({rows}, detail::options_of(logits));
  Tensor valid = Tensor::empty({rows}, detail::options_of(logits));
  Tensor stats = Tensor::empty({rows, 2}, detail::options_of(logits));
  dispatch_cpu_only(x.device(), [&] {
    kernels::cross_entropy_rows_cpu(x.dtype(), rows, classes, x.data_ptr(), tc.data<int64_t>(), ignore_index,
                                    loss.data_ptr(), valid.data_ptr(), stats.data_ptr());
  });
  Tensor saved_x = x.detach(), saved_target = tc.detach();
  autograd::record(loss, {logits}, "CrossEntropyBackward",
                   [saved_x, saved_target, stats, ignore_index](const Tensor& g) -> std::vector<Tensor> {
                     Tensor gc = g.contiguous();
                     Tensor dx = Tensor::empty(saved_x.shape(), detail::options_of(saved_x));
                     dispatch_cpu_only(dx.device(), [&] {
                       kernels::cross_entropy_rows_backward_cpu(
                           dx.dtype(), saved_x.size(0), saved_x.size(1), saved_x.data_ptr(), stats.data_ptr(),
                           saved_target.data<int64_t>(), ignore_index, gc.data_ptr(), dx.data_ptr());
                     });
                     return {dx};
                   });
  return div(sum(loss), sum(valid));  // nll_loss_mean's reduction on CPU devices
}

}  // namespace dpe
