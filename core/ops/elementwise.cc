// Elementwise ops: broadcasting binary ops, unary math and activations, and their backward.
#include "core/autograd/function.h"
#include "core/dispatch.h"
#include "core/copy.h"
#include "core/kernels/elementwise.h"
#include "core/ops.h"
#include "core/ops/op_checks.h"

namespace dpe {

using kernels::ActivationOp;
using kernels::BinaryOp;
using kernels::UnaryOp;
using detail::check_compute_dtype;
using detail::options_of;

namespace {

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    DPE_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
              " are not broadcastable (dimension ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// out = a (op) b, no autograd.
Tensor binary_forward(BinaryOp op, const Tensor& a, const Tensor& b, const char* name) {
  detail::check_same_device_and_dtype(a, b, name);
  check_compute_dtype(a, name);
  Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  // Note [Memory formats]: an operand of the result's shape in channels-last memory makes the result channels
  // last (PyTorch's TensorIterator follows its inputs' layout); the kernels then run in NHWC order, where the
  // result is contiguous.
  auto shapes_channels_last = [&](const Tensor& t) {
    return t.shape() == shape && t.dim() == 4 && t.suggest_memory_format() == MemoryFormat::ChannelsLast;
  };
  const bool channels_last = shapes_channels_last(a) || shapes_channels_last(b);
  const MemoryFormat format = channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  Tensor out = Tensor::empty(shape, options_of(a), format);
  if (out.numel() == 0) return out;
  Tensor ea = a.detach().expand(shape), eb = b.detach().expand(shape), eo = out;
  if (channels_last) {
    const std::vector<int64_t> nhwc = {0, 2, 3, 1};
    ea = ea.permute(nhwc);
    eb = eb.permute(nhwc);
    eo = out.permute(nhwc);
  }
  kernels::Layout lo = layout_of(eo), la = layout_of(ea), lb = layout_of(eb);
  dispatch(
      out.device(),
      [&] { kernels::binary_cpu(op, out.dtype(), lo, ea.data_ptr(), la, eb.data_ptr(), lb, out.data_ptr()); },
      [&](auto stream) {
        kernels::binary_cuda(stream, op, out.dtype(), lo, ea.data_ptr(), la, eb.data_ptr(), lb, out.data_ptr());
      });
  return out;
}

// Unary kernels run over the elements in memory order: a channels-last x gives a channels-last result (Note
// [Memory formats]), anything else not contiguous is copied first.
Tensor unary_forward(UnaryOp op, const Tensor& x, const char* name) {
  check_compute_dtype(x, name);
  const MemoryFormat format = x.suggest_memory_format();
  Tensor in = x.contiguous(format);
  Tensor out = Tensor::empty(x.shape(), options_of(x), format);
  dispatch(
      x.device(), [&] { kernels::unary_cpu(op, x.dtype(), x.numel(), in.data_ptr(), out.data_ptr()); },
      [&](auto stream) { kernels::unary_cuda(stream, op, x.dtype(), x.numel(), in.data_ptr(), out.data_ptr()); });
  return out;
}

// dx = dy * f'(x), in x's memory format.
Tensor activation_backward(ActivationOp op, const Tensor& x, const Tensor& dy) {
  const MemoryFormat format = x.suggest_memory_format();
  Tensor xc = x.contiguous(format), dyc = dy.contiguous(format);
  Tensor dx = Tensor::empty(x.shape(), options_of(x), format);
  dispatch(
      x.device(),
      [&] { kernels::activation_backward_cpu(op, x.dtype(), x.numel(), xc.data_ptr(), dyc.data_ptr(), dx.data_ptr()); },
      [&](auto stream) {
        kernels::activation_backward_cuda(stream, op, x.dtype(), x.numel(), xc.data_ptr(), dyc.data_ptr(),
                                          dx.data_ptr());
      });
  return dx;
}

Tensor activation(UnaryOp op, ActivationOp grad_op, const Tensor& x, const char* name) {
  Tensor out = unary_forward(op, x, name);
  Tensor saved = x.detach();
  autograd::record(out, {x}, std::string(name) + "Backward", [grad_op, saved](const Tensor& g) -> std::vector<Tensor> {
    return {activation_backward(grad_op, saved, g)};
  });
  return out;
}

}  // namespace

// ---- binary ----

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::Add, a, b, "add");
  Shape sa = a.shape(), sb = b.shape();
  autograd::record(out, {a, b}, "AddBackward", [sa, sb](const Tensor& g) -> std::vector<Tensor> {
    return {sum_to(g, sa), sum_to(g, sb)};
  });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::Sub, a, b, "sub");
  Shape sa = a.shape(), sb = b.shape();
  autograd::record(out, {a, b}, "SubBackward", [sa, sb](const Tensor& g) -> std::vector<Tensor> {
    return {sum_to(g, sa), sum_to(neg(g), sb)};
  });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::Mul, a, b, "mul");
  bool grad_a = a.requires_grad(), grad_b = b.requires_grad();
  Tensor sa = a.detach(), sb = b.detach();
  autograd::record(out, {a, b}, "MulBackward", [sa, sb, grad_a, grad_b](const Tensor& g) -> std::vector<Tensor> {
    return {grad_a ? sum_to(mul(g, sb), sa.shape()) : Tensor(), grad_b ? sum_to(mul(g, sa), sb.shape()) : Tensor()};
  });
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::Div, a, b, "div");
  bool grad_b = b.requires_grad();
  Tensor sb = b.detach(), sout = out.detach();
  Shape sa = a.shape();
  autograd::record(out, {a, b}, "DivBackward", [sa, sb, sout, grad_b](const Tensor& g) -> std::vector<Tensor> {
    Tensor ga = div(g, sb);
    // d(a/b)/db = -(a/b)/b = -out/b
    return {sum_to(ga, sa), grad_b ? sum_to(neg(mul(ga, sout)), sb.shape()) : Tensor()};
  });
  return out;
}

// ---- scalar ----

Tensor affine(const Tensor& x, double alpha, double beta) {
  check_compute_dtype(x, "affine");
  Tensor in = x.contiguous();
  Tensor out = Tensor::empty(x.shape(), options_of(x));
  dispatch(
      x.device(), [&] { kernels::affine_cpu(x.dtype(), x.numel(), in.data_ptr(), alpha, beta, out.data_ptr()); },
      [&](auto stream) {
        kernels::affine_cuda(stream, x.dtype(), x.numel(), in.data_ptr(), alpha, beta, out.data_ptr());
      });
  autograd::record(out, {x}, "AffineBackward",
                   [alpha](const Tensor& g) -> std::vector<Tensor> { return {affine(g, alpha, 0.0)}; });
  return out;
}

Tensor add(const Tensor& a, double b) { return affine(a, 1.0, b); }
Tensor mul(const Tensor& a, double b) { return affine(a, b, 0.0); }
Tensor neg(const Tensor& x) { return affine(x, -1.0, 0.0); }

// ---- unary math ----

Tensor exp(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Exp, x, "exp");
  Tensor saved = out.detach();
  autograd::record(out, {x}, "ExpBackward", [saved](const Tensor& g) -> std::vector<Tensor> { return {mul(g, saved)}; });
  return out;
}

Tensor log(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Log, x, "log");
  Tensor saved = x.detach();
  autograd::record(out, {x}, "LogBackward", [saved](const Tensor& g) -> std::vector<Tensor> { return {div(g, saved)}; });
  return out;
}

Tensor sqrt(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Sqrt, x, "sqrt");
  Tensor saved = out.detach();
  autograd::record(out, {x}, "SqrtBackward",
                   [saved](const Tensor& g) -> std::vector<Tensor> { return {div(mul(g, 0.5), saved)}; });
  return out;
}

Tensor rsqrt(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Rsqrt, x, "rsqrt");
  Tensor saved = out.detach();
  // d(x^-1/2)/dx = -1/2 x^-3/2 = -1/2 y^3
  autograd::record(out, {x}, "RsqrtBackward", [saved](const Tensor& g) -> std::vector<Tensor> {
    return {mul(g, mul(mul(saved, square(saved)), -0.5))};
  });
  return out;
}

Tensor square(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Square, x, "square");
  Tensor saved = x.detach();
  autograd::record(out, {x}, "SquareBackward",
                   [saved](const Tensor& g) -> std::vector<Tensor> { return {mul(g, mul(saved, 2.0))}; });
  return out;
}

Tensor reciprocal(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Reciprocal, x, "reciprocal");
  Tensor saved = out.detach();
  autograd::record(out, {x}, "ReciprocalBackward",
                   [saved](const Tensor& g) -> std::vector<Tensor> { return {neg(mul(g, square(saved)))}; });
  return out;
}

// ---- activations ----

Tensor relu(const Tensor& x) { return activation(UnaryOp::Relu, ActivationOp::Relu, x, "Relu"); }
Tensor gelu(const Tensor& x) { return activation(UnaryOp::Gelu, ActivationOp::Gelu, x, "Gelu"); }
Tensor silu(const Tensor& x) { return activation(UnaryOp::Silu, ActivationOp::Silu, x, "Silu"); }

// gate, up: the same shape, contiguous (else the composition)  ->  that shape
Tensor silu_mul(const Tensor& gate, const Tensor& up) {
  check_compute_dtype(gate, "silu_mul");
  detail::check_same_device_and_dtype(gate, up, "silu_mul");
  if (gate.shape() != up.shape() || !gate.is_contiguous() || !up.is_contiguous()) {
    return mul(silu(gate), up);  // keeps a channels-last operand's format, broadcasts
  }
  const Tensor g = gate.detach(), u = up.detach();
  Tensor y = Tensor::empty(gate.shape(), options_of(gate));
  dispatch(
      gate.device(),
      [&] { kernels::silu_mul_cpu(gate.dtype(), gate.numel(), g.data_ptr(), u.data_ptr(), y.data_ptr()); },
      [&](auto stream) {
        kernels::silu_mul_cuda(stream, gate.dtype(), gate.numel(), g.data_ptr(), u.data_ptr(), y.data_ptr());
      });
  const bool grad_gate = gate.requires_grad(), grad_up = up.requires_grad();
  autograd::record(y, {gate, up}, "SiluMulBackward", [g, u, grad_gate, grad_up](const Tensor& dy) {
    const Tensor dyc = dy.contiguous();
    Tensor dgate = grad_gate ? Tensor::empty(g.shape(), options_of(g)) : Tensor();
    Tensor dup = grad_up ? Tensor::empty(g.shape(), options_of(g)) : Tensor();
    dispatch(
        g.device(),
        [&] {
          kernels::silu_mul_backward_cpu(g.dtype(), g.numel(), g.data_ptr(), u.data_ptr(), dyc.data_ptr(),
                                         detail::data_or_null(dgate), detail::data_or_null(dup));
        },
        [&](auto stream) {
          kernels::silu_mul_backward_cuda(stream, g.dtype(), g.numel(), g.data_ptr(), u.data_ptr(), dyc.data_ptr(),
                                          detail::data_or_null(dgate), detail::data_or_null(dup));
        });
    return std::vector<Tensor>{dgate, dup};
  });
  return y;
}

Tensor tanh(const Tensor& x) { return activation(UnaryOp::Tanh, ActivationOp::Tanh, x, "Tanh"); }
Tensor sigmoid(const Tensor& x) { return activation(UnaryOp::Sigmoid, ActivationOp::Sigmoid, x, "Sigmoid"); }

// ---- operators ----

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
Tensor operator+(const Tensor& a, double b) { return add(a, b); }
Tensor operator-(const Tensor& a, double b) { return add(a, -b); }
Tensor operator/(const Tensor& a, double b) { return mul(a, 1.0 / b); }

}  // namespace dpe
