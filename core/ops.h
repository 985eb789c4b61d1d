// Differentiable tensor operations (PyTorch names and semantics unless a comment says otherwise).
//
// Every op checks its inputs (same device, floating dtype where needed, compatible shapes) and throws
// naming the shapes/devices; runs the CPU or CUDA kernel of the inputs' device; and, when grad mode is on
// and an input requires grad, records its backward (core/autograd). Binary ops broadcast like NumPy.
// Compute dtypes are float32 and float64; float16/bfloat16 tensors must be cast first (to(DType)).
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "core/tensor.h"

namespace dpe {

// ---- creation ----
Tensor zeros(const Shape& shape, TensorOptions options = {});
Tensor ones(const Shape& shape, TensorOptions options = {});
Tensor full(const Shape& shape, double value, TensorOptions options = {});
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor empty_like(const Tensor& t);
Tensor arange(int64_t n, TensorOptions options = {});  // 0, 1, ..., n-1
Tensor scalar_tensor(double value, TensorOptions options = {});  // 0-dim

// ---- random (counter-based Philox: the same seed gives the same numbers on CPU and CUDA) ----
// A generator is a (seed, offset) pair; each fill consumes numel counters.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  void manual_seed(uint64_t seed);
  uint64_t seed() const;
  uint64_t offset() const;
  void set_offset(uint64_t offset);
  // Reserves n counters and returns the first (thread-safe).
  uint64_t advance(uint64_t n);

 private:
  mutable std::mutex mutex_;
  uint64_t seed_;
  uint64_t offset_ = 0;
};
// Each device has a default generator, seeded by manual_seed (all devices) with the same seed.
Generator& default_generator(const Device& d);
void manual_seed(uint64_t seed);

Tensor rand(const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);   // U[0, 1)
Tensor randn(const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);  // N(0, 1)
// 1 with probability p, else 0, in x's dtype and device (dropout masks).
Tensor bernoulli(const Shape& shape, double p, TensorOptions options = {}, Generator* gen = nullptr);

// ---- elementwise ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor affine(const Tensor& x, double alpha, double beta);  // alpha * x + beta
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor square(const Tensor& x);
Tensor reciprocal(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);  // exact (erf) form
Tensor silu(const Tensor& x);
// silu(gate) * up (SwiGLU's gating, Llama's feed-forward). On CPU devices, for contiguous operands of one shape,
// one fused pass each way (kernels/elementwise.h: the composition's numbers, silu(gate) not kept for the
// backward); elsewhere, and with broadcasting, the composition.
Tensor silu_mul(const Tensor& gate, const Tensor& up);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& x);
Tensor operator*(const Tensor& a, double b);
Tensor operator*(double a, const Tensor& b);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);

// ---- reductions ----
Tensor sum(const Tensor& x);  // 0-dim
Tensor sum(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor max(const Tensor& x);  // 0-dim; gradient to the first maximum
struct ValuesIndices {
  Tensor values;
  Tensor indices;  // int64
};
ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor min(const Tensor& x);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);  // int64, first maximum
// Sums `x` down to `shape` (the inverse of broadcasting); used by broadcasting ops' backward.
Tensor sum_to(const Tensor& x, const Shape& shape);

// ---- linear algebra ----
// a: (m, k) or (b, m, k); b: (k, n) or (b, k, n). A 2-d operand is broadcast over the other's batch.
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);  // (b, m, k) @ (b, k, n)
// PyTorch's F.linear: x (..., in) @ weight (out, in)^T + bias (out) or undefined -> (..., out).
// Under autocast (core/amp/autocast.h) matmul, bmm and linear multiply 16-bit casts of float32 operands,
// accumulate and return float32.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// ---- softmax ----
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

// ---- joining ----
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);

// ---- comparison helpers for tests and tools (not differentiable) ----
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);
bool equal(const Tensor& a, const Tensor& b);  // same shape and exactly equal values
double max_abs_diff(const Tensor& a, const Tensor& b);

}  // namespace dpe
