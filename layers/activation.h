// Activation modules (PyTorch's nn.ReLU, nn.GELU, nn.SiLU, nn.Tanh) and nn.Flatten: stateless wrappers
// over the ops of core/ops.h, Cloneable so they sit in Sequential models that DataParallel replicates.
// No parameters, no buffers.
#pragma once

#include "layers/module.h"

namespace dpe::nn {

// x: any shape  ->  x's shape (elementwise)
class ReLU : public Cloneable<ReLU> {
 public:
  ReLU() : Cloneable("ReLU") {}
  Tensor forward(const Tensor& x) override;
};

// The exact (erf) GELU, PyTorch's default approximate='none'.
class GELU : public Cloneable<GELU> {
 public:
  GELU() : Cloneable("GELU") {}
  Tensor forward(const Tensor& x) override;
};

class SiLU : public Cloneable<SiLU> {
 public:
  SiLU() : Cloneable("SiLU") {}
  Tensor forward(const Tensor& x) override;
};

class Tanh : public Cloneable<Tanh> {
 public:
  Tanh() : Cloneable("Tanh") {}
  Tensor forward(const Tensor& x) override;
};

// x: (d0, ..., d_start, ..., d_end, ...)  ->  dims start_dim..end_dim merged into one (a view when possible).
// Defaults keep the batch dim: (N, C, H, W) -> (N, C*H*W).
class Flatten : public Cloneable<Flatten> {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : Cloneable("Flatten"), start_dim_(start_dim), end_dim_(end_dim) {}
  Tensor forward(const Tensor& x) override;

  int64_t start_dim() const { return start_dim_; }
  int64_t end_dim() const { return end_dim_; }

 private:
  int64_t start_dim_;
  int64_t end_dim_;
};

}  // namespace dpe::nn
