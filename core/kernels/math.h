// Scalar math of every elementwise op, for both backends. Contract: T is float or double.
// GELU is the exact (erf) form, PyTorch's default approximate='none'.
#pragma once

#include <cmath>
#include <type_traits>

#include "core/host_device.h"
#include "core/kernels/op_enums.h"

namespace dpe::kernels {

template <typename T>
DPE_HOST_DEVICE T sigmoid_of(T x) {
  using std::exp;  // without it, host code picks ::exp(double) for float while CUDA picks expf
  return T(1) / (T(1) + exp(-x));
}

template <typename T>
DPE_HOST_DEVICE T apply_unary(UnaryOp op, T x) {
  using std::abs, std::erf, std::exp, std::log, std::sqrt, std::tanh;
  switch (op) {
    case UnaryOp::Neg: return -x;
    case UnaryOp::Exp: return exp(x);
    case UnaryOp::Log: return log(x);
    case UnaryOp::Sqrt: return sqrt(x);
    case UnaryOp::Rsqrt: return T(1) / sqrt(x);
    case UnaryOp::Abs: return abs(x);
    case UnaryOp::Square: return x * x;
    case UnaryOp::Reciprocal: return T(1) / x;
    case UnaryOp::Relu: return x <= T(0) ? T(0) : x;  // NaN stays NaN, like PyTorch's relu
    case UnaryOp::Gelu: return T(0.5) * x * (T(1) + erf(x * T(0.70710678118654752440)));
    case UnaryOp::Silu: return x * sigmoid_of(x);
    case UnaryOp::Tanh: return tanh(x);
    case UnaryOp::Sigmoid: return sigmoid_of(x);
  }
  return x;
}

// dx = dy * f'(x) for the activations.
template <typename T>
DPE_HOST_DEVICE T activation_backward(ActivationOp op, T x, T dy) {
  using std::erf, std::exp, std::tanh;
  switch (op) {
    // PyTorch's threshold_backward: 0 wherever x <= 0, even for an infinite or NaN dy; dy where x is NaN (the
    // forward passed the NaN on). Written as a select of two loaded values, which vectorises (dy * (x > 0)
    // compiled to a compare-and-branch per element, scalar: 6% of an MLP step).
    case ActivationOp::Relu: return x <= T(0) ? T(0) : dy;
    case ActivationOp::Gelu: {
      T cdf = T(0.5) * (T(1) + erf(x * T(0.70710678118654752440)));
      T pdf = exp(T(-0.5) * x * x) * T(0.39894228040143267794);  // 1/sqrt(2*pi)
      return dy * (cdf + x * pdf);
    }
    case ActivationOp::Silu: {
      T s = sigmoid_of(x);
      return dy * (s * (T(1) + x * (T(1) - s)));
    }
    case ActivationOp::Tanh: {
      T t = tanh(x);
      return dy * (T(1) - t * t);
    }
    case ActivationOp::Sigmoid: {
      T s = sigmoid_of(x);
      return dy * (s * (T(1) - s));
    }
  }
  return T(0);
}

template <typename T>
DPE_HOST_DEVICE T apply_binary(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::Add: return a + b;
    case BinaryOp::Sub: return a - b;
    case BinaryOp::Mul: return a * b;
    case BinaryOp::Div: return a / b;
    // NaN in either operand propagates (like torch.maximum); `a > b ? a : b` alone dropped a NaN in a.
    case BinaryOp::Maximum: return (a > b || a != a) ? a : b;
    case BinaryOp::Minimum: return (a < b || a != a) ? a : b;
  }
  return a;
}

// SGD's options as compile-time constants: each combination gets its own loop with no per-element branch
// (the CPU loop then vectorises; with runtime flags it stayed scalar and was slower than the unfused ops).
template <bool kMomentum, bool kFirstStep, bool kNesterov, bool kWeightDecay>
struct SgdFlags {
  static constexpr bool momentum = kMomentum, first_step = kFirstStep, nesterov = kNesterov,
                        weight_decay = kWeightDecay;
};

// Calls f(SgdFlags<...>{}) for the given runtime values.
template <typename F>
void dispatch_sgd_flags(bool momentum, bool first_step, bool nesterov, bool weight_decay, F&& f) {
  auto pick = [](bool value, auto&& next) {
    if (value) {
      next(std::true_type{});
    } else {
      next(std::false_type{});
    }
  };
  pick(momentum, [&](auto m) {
    pick(first_step, [&](auto first) {
      pick(nesterov, [&](auto n) {
        pick(weight_decay, [&](auto wd) {
          f(SgdFlags<decltype(m)::value, decltype(first)::value, decltype(n)::value, decltype(wd)::value>{});
        });
      });
    });
  });
}

// One element of PyTorch's SGD step (torch/optim/sgd.py, foreach=False), in its order of operations:
//   d = g + weight_decay * p;  buf = first_step ? d : momentum * buf + (1 - dampening) * d;
//   d = nesterov ? d + momentum * buf : buf;  p = p - lr * d.
// buf: the element's momentum buffer (only touched with Flags::momentum). Each line is one fma, so CPU and
// CUDA round alike.
template <typename Flags, typename T>
DPE_HOST_DEVICE T sgd_updated_param(T p, T g, T* buf, T lr, T momentum, T dampening_complement, T weight_decay) {
  using std::fma;
  T d = g;
  if constexpr (Flags::weight_decay) d = fma(weight_decay, p, g);
  if constexpr (Flags::momentum) {
    if constexpr (Flags::first_step) {
      *buf = d;
    } else {
      *buf = fma(dampening_complement, d, momentum * *buf);
    }
    d = Flags::nesterov ? fma(momentum, *buf, d) : *buf;
  }
  return fma(-lr, d, p);
}

// Adam's per-step constants in the element's type (PyTorch 1.13's single-tensor Adam and AdamW,
// torch/optim/adam.py): bias corrections bc1 = 1 - beta1^step, bc2 = 1 - beta2^step.
template <typename T>
struct AdamConstants {
  T beta1, one_minus_beta1, beta2, one_minus_beta2;
  T eps;
  T weight_decay;        // Adam's L2 term (0 for AdamW and without weight decay)
  T decay;               // AdamW's decoupled factor 1 - lr * weight_decay (1 for Adam)
  T neg_step_size;       // -lr / bc1
  T sqrt_bias_correction2;  // sqrt(bc2)
};

// The constants of step number `step` (1 for the first), from the options in double as PyTorch computes them.
template <typename T>
AdamConstants<T> adam_constants(double lr, double beta1, double beta2, double eps, double weight_decay,
                                bool decoupled, double step) {
  const double bias_correction1 = 1.0 - std::pow(beta1, step), bias_correction2 = 1.0 - std::pow(beta2, step);
  return {static_cast<T>(beta1),
          static_cast<T>(1.0 - beta1),
          static_cast<T>(beta2),
          static_cast<T>(1.0 - beta2),
          static_cast<T>(eps),
          static_cast<T>(decoupled ? 0.0 : weight_decay),
          static_cast<T>(decoupled ? 1.0 - lr * weight_decay : 1.0),
          static_cast<T>(-(lr / bias_correction1)),
          static_cast<T>(std::sqrt(bias_correction2))};
}

// One element of the step, in PyTorch's order of operations:
//   p = decay * p (AdamW);  d = g + weight_decay * p (Adam);  m = beta1 * m + (1 - beta1) * d;
//   v = beta2 * v + (1 - beta2) * d * d;  p = p - step_size * m / (sqrt(v) / sqrt(bc2) + eps).
// Each product or sum that the tensor ops round separately is rounded here too, and each "x * y + z" is one
// fma, so CPU and CUDA round alike (d * d and the quotients are single operations).
template <typename T>
DPE_HOST_DEVICE T adam_updated_param(T p, T g, T* exp_avg, T* exp_avg_sq, const AdamConstants<T>& c) {
  using std::fma;
  using std::sqrt;
  p = c.decay * p;
  const T d = c.weight_decay != T(0) ? fma(c.weight_decay, p, g) : g;  // g alone, even where p is not finite
  const T m = fma(c.one_minus_beta1, d, c.beta1 * *exp_avg);
  const T v = fma(c.one_minus_beta2, d * d, c.beta2 * *exp_avg_sq);
  *exp_avg = m;
  *exp_avg_sq = v;
  const T denom = sqrt(v) / c.sqrt_bias_correction2 + c.eps;
  return fma(c.neg_step_size, m / denom, p);
}

}  // namespace dpe::kernels
