// The op enums shared by the CPU and CUDA kernels. Each enumerator's math is defined once, in
// core/kernels/math.h (host and device), so both backends compute the same function.
#pragma once

#include <cstdint>

namespace dpe::kernels {

// y = f(x), elementwise.
enum class UnaryOp : uint8_t {
  Neg, Exp, Log, Sqrt, Rsqrt, Abs, Square, Reciprocal,
  Relu, Gelu, Silu, Tanh, Sigmoid,
};

// Activations whose derivative has a kernel: dx = dy * f'(x), computed from the input x.
enum class ActivationOp : uint8_t { Relu, Gelu, Silu, Tanh, Sigmoid };

// out = a (op) b, elementwise with broadcasting.
enum class BinaryOp : uint8_t { Add, Sub, Mul, Div, Maximum, Minimum };

// Reductions over one axis (and over everything, as outer = inner = 1). Not the collectives' ReduceOp
// (collectives/reduce_buffers.h), which combines whole tensors across devices.
enum class AxisReduction : uint8_t { Sum, Mean, Max, Min };

}  // namespace dpe::kernels
